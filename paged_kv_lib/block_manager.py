"""``BlockManager``: which sequence holds which block. Bookkeeping only, no tensors.

Everything a paged allocator decides lives here, so one file answers "who holds what, and why":

* the free queue (:class:`FreeBlockQueue`), the blocks handed out next;
* the manager's state: one :class:`~paged_kv_lib.block.Block` per physical block (ref count,
  content key), the free queue, the prefix cache (content key -> block), each resident
  sequence's :class:`~paged_kv_lib.block.BlockTable`, and the CPU swap pool with the tables of
  the sequences swapped out to it;
* its rules, each written once as a helper the questions and the acts share: what a growth
  step takes (:func:`growth_demand`), the watermark, what a prompt takes (``_plan_prompt``);
* the acts, each checking before it changes anything (a call that raises changes nothing),
  the scheduler's one call per step among them (:meth:`BlockManager.allocate_slots`, which
  returns ``None`` rather than grow what does not fit), and the questions;
* :class:`AllocatorStats` and :meth:`BlockManager.check_invariants`.

It alone changes ref counts. It moves no bytes: copy-on-write calls ``on_copy(src, dst)``, and
``swap_out``/``swap_in`` return the block ids whose bytes to move.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import asdict, dataclass
from itertools import chain
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple
from typing import Union

from ._validate import as_count, as_fraction, as_iterable, as_seq_id, as_token_ids
from .block import Block, BlockTable, cdiv, tokens_in_blocks
from .errors import BlocksInUseError, DuplicateSequenceError, EmptyFreeQueueError, InvalidArgumentError
from .errors import InvalidTypeError, InvariantError, OutOfBlocksError, SequenceStateError, UnknownSequenceError
from .prefix_cache import PrefixCache, as_extra_key, block_key, chain_keys

TokenIds = Optional[Sequence[int]]
TokenRow = Union[int, TokenIds]  # a sequence's new tokens in a growth step; one token may be given bare
ExtraKey = Optional[Union[bytes, str]]
Placed = Dict[int, Tuple[int, ...]]
NOT_QUEUED = -2
INT = frozenset({int})  # what a plain int id or token id is, for the checks at C speed


class FreeBlockQueue:
    """The free blocks, in the order they are handed out: an O(1) FIFO with removal from the middle.

    The seed used ``collections.deque``; a prefix-cache hit on a block in the middle of the queue must
    take it out, and ``deque.remove`` scans the queue (O(n)). Here the queue is a doubly linked list
    threaded through two int arrays indexed by block id (``_prev``, ``_next``; index ``num_blocks`` is the
    sentinel), so popping the head, appending at the tail and removing any block are O(1). Invariants
    (:meth:`check`): following ``_next`` from the head visits every queued block once and ends at the
    tail, ``_prev`` mirrors it; a block is queued exactly when ``_prev[block_id] != NOT_QUEUED``. Freed
    blocks go to the tail, so the head is the least recently freed (LRU eviction of cached blocks).
    A bad id raises a typed error and an over-long pop :class:`EmptyFreeQueueError`, changing nothing.
    """

    __slots__ = ("_prev", "_next", "_sentinel", "_len")

    def __init__(self, num_blocks: int, block_ids: Iterable[int] = ()) -> None:
        num_blocks = as_count(num_blocks, "num_blocks")
        self._sentinel = num_blocks
        self._prev: List[int] = [NOT_QUEUED] * num_blocks + [num_blocks]
        self._next: List[int] = [NOT_QUEUED] * num_blocks + [num_blocks]
        self._len = 0
        self.extend(block_ids)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block_id: object) -> bool:
        return type(block_id) is int and 0 <= block_id < self._sentinel and self._prev[block_id] != NOT_QUEUED

    def __iter__(self) -> Iterator[int]:
        """Block ids from head (next to be handed out) to tail."""
        node = self._next[self._sentinel]
        while node != self._sentinel:
            yield node
            node = self._next[node]

    def __repr__(self) -> str:
        return f"FreeBlockQueue({list(self)})"

    def peek(self) -> int:
        """The id at the head, without removing it."""
        if self._len == 0:
            raise EmptyFreeQueueError("peek from an empty free queue")
        return self._next[self._sentinel]

    def popleft(self) -> int:
        """Remove and return the id at the head."""
        sentinel, prev_of, next_of = self._sentinel, self._prev, self._next
        block_id = next_of[sentinel]
        if block_id == sentinel:
            raise EmptyFreeQueueError("pop from an empty free queue")
        next_of[sentinel] = after = next_of[block_id]
        prev_of[after] = sentinel
        prev_of[block_id] = next_of[block_id] = NOT_QUEUED
        self._len -= 1
        return block_id

    def pop_many(self, n: int) -> List[int]:
        """Remove and return the ``n`` ids at the head, in order (one call for a whole allocation)."""
        if type(n) is not int:
            raise InvalidTypeError(f"n must be an int, got {type(n).__name__} {n!r}")
        if n < 0:
            raise InvalidArgumentError(f"n must be >= 0, got {n}")
        if n > self._len:
            raise EmptyFreeQueueError(f"pop {n} from a free queue of {self._len}")
        sentinel, prev_of, next_of = self._sentinel, self._prev, self._next
        ids = []
        block_id = next_of[sentinel]
        for _ in range(n):
            ids.append(block_id)
            after = next_of[block_id]
            prev_of[block_id] = next_of[block_id] = NOT_QUEUED
            block_id = after
        next_of[sentinel] = block_id
        prev_of[block_id] = sentinel
        self._len -= n
        return ids

    def extend(self, block_ids: Iterable[int]) -> None:
        """Append several ids at the tail, in order; every id is checked before any is linked."""
        ids = list(block_ids)
        for block_id in ids:
            self._check(block_id, queued=False)
        if len(set(ids)) != len(ids):
            twice = next(b for b in ids if ids.count(b) > 1)
            raise InvalidArgumentError(f"block {twice} appears twice in one extend")
        self.extend_unchecked(ids)

    def extend_unchecked(self, block_ids: List[int]) -> None:
        """:meth:`extend` for a caller that knows the ids are valid, distinct and not queued (the manager,
        releasing blocks whose ref count just fell to 0). Wrong ids corrupt the queue; :meth:`check` says so."""
        sentinel, prev_of, next_of = self._sentinel, self._prev, self._next
        tail = prev_of[sentinel]
        for block_id in block_ids:
            next_of[tail] = block_id
            prev_of[block_id] = tail
            tail = block_id
        next_of[tail] = sentinel
        prev_of[sentinel] = tail
        self._len += len(block_ids)

    def append(self, block_id: int) -> None:
        """Put ``block_id`` at the tail (it will be handed out last)."""
        self._check(block_id, queued=False)
        self.extend_unchecked([block_id])

    def appendleft(self, block_id: int) -> None:
        """Put ``block_id`` at the head (it will be handed out first)."""
        self._check(block_id, queued=False)
        head = self._next[self._sentinel]
        self._prev[head] = block_id
        self._next[block_id] = head
        self._prev[block_id] = self._sentinel
        self._next[self._sentinel] = block_id
        self._len += 1

    def remove(self, block_id: int) -> None:
        """Take ``block_id`` out of the queue, wherever it is, in O(1)."""
        self._check(block_id, queued=True)
        prev, nxt = self._prev[block_id], self._next[block_id]
        self._next[prev] = nxt
        self._prev[nxt] = prev
        self._prev[block_id] = self._next[block_id] = NOT_QUEUED
        self._len -= 1

    def _check(self, block_id: object, *, queued: bool) -> None:
        """Raise the typed error for a bad id (``queued``: the call needs it in the queue)."""
        if type(block_id) is not int:
            raise InvalidTypeError(f"block id must be an int, got {type(block_id).__name__} {block_id!r}")
        if not 0 <= block_id < self._sentinel:
            raise InvalidArgumentError(f"block {block_id} is out of range: the queue holds ids 0..{self._sentinel - 1}")
        if (self._prev[block_id] != NOT_QUEUED) != queued:
            raise InvalidArgumentError(f"block {block_id} is {'not in' if queued else 'already in'} the free queue")

    def check(self) -> None:
        """Raise ``AssertionError`` if the links are inconsistent."""
        seen, node = 0, self._sentinel
        while True:
            nxt = self._next[node]
            assert self._prev[nxt] == node, f"broken link between {node} and {nxt}"
            if nxt == self._sentinel:
                break
            seen += 1
            assert seen <= self._len, "free queue has a cycle or more nodes than its length"
            node = nxt
        assert seen == self._len, f"free queue length {self._len} but {seen} linked"
        queued = sum(1 for p in self._prev[: self._sentinel] if p != NOT_QUEUED)
        assert queued == self._len, f"{queued} blocks marked queued, length {self._len}"


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of the pool: block counts, tokens stored, sharing and caching counters."""

    total_blocks: int
    free_blocks: int
    used_blocks: int
    num_sequences: int
    tokens_stored: int
    logical_tokens: int
    utilization: float
    cached_free_blocks: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    cow_copies: int = 0
    swapped_sequences: int = 0
    cpu_free_blocks: int = 0
    cpu_total_blocks: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        """Fraction of full prompt blocks looked up that were found cached."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def as_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["prefix_hit_rate"] = self.prefix_hit_rate
        return out


def watermark_blocks(watermark: float, num_blocks: int) -> int:
    """Blocks an admission must leave free: ``ceil(watermark * num_blocks)`` (``watermark`` checked, in [0, 1])."""
    return math.ceil(as_fraction(watermark, "watermark") * num_blocks)


def blocks_to_hold(num_tokens: int, num_seqs: int, block_size: int, num_blocks: int, watermark: float) -> int:
    """The most blocks ``num_seqs`` sequences of up to ``num_tokens`` tokens each may hold (every sequence with
    private blocks: sharing only lowers it), plus the watermark; the pool can ever serve them if this is at
    most ``num_blocks``."""
    num_seqs = as_count(num_seqs, "num_seqs", minimum=1)
    return num_seqs * cdiv(as_count(num_tokens, "num_tokens"), block_size) + watermark_blocks(watermark, num_blocks)


def room_to_grow(table: BlockTable, up_to: int, spare: int, block_size: int, blocks: Sequence[Block]) -> int:
    """The most tokens, at most ``up_to``, ``table`` can grow by taking at most ``spare`` free blocks: room in
    its last block and whole new blocks, after a copy of a shared last block with room (:func:`growth_demand`)."""
    ids = table.block_ids
    spare -= bool(up_to and table.num_tokens < len(ids) * block_size and blocks[ids[-1]].ref_count > 1)
    return 0 if spare < 0 else max(0, min(up_to, (len(ids) + spare) * block_size - table.num_tokens))


def growth_demand(tables: Sequence[BlockTable], num_tokens: int, block_size: int,
                  blocks: Sequence[Block]) -> int:
    """The free blocks growing every table by ``num_tokens`` in one step takes. The one home of the growth rule,
    for the questions and the acts alike.

    A table takes new blocks for the tokens past its capacity. A last block with room that other tables
    also hold is copied before the write (copy-on-write); a full one is never written again, so it stays
    shared. A tail held by ``r`` tables and grown by ``k`` of them is copied ``min(k, r - 1)`` times: the
    last holder writes in place.
    """
    needed = 0
    growers: Dict[int, int] = {}  # shared tail with room -> listed tables growing it
    for table in tables:
        ids = table.block_ids
        room = len(ids) * block_size - table.num_tokens  # free slots in the blocks it holds
        if room and num_tokens and blocks[ids[-1]].ref_count > 1:
            growers[ids[-1]] = growers.get(ids[-1], 0) + 1
        if num_tokens > room:
            needed += cdiv(num_tokens - room, block_size)
    for tail, k in growers.items():
        needed += min(k, blocks[tail].ref_count - 1)
    return needed


class PromptPlan(NamedTuple):
    """What allocating a prompt takes, worked out before anything changes."""

    tokens: Optional[List[int]]
    salt: Optional[bytes]
    keys: List[bytes]
    hits: List[int]  # cached blocks reused, in logical order
    hit_free: int  # how many of the hits sit in the free queue (taking them shrinks it)
    new_blocks: int  # fresh blocks to pop off the free queue


class BlockManager:
    """Hands out a pool of fixed-size blocks to growing, forking, swapping sequences.

    Args:
        num_blocks: physical blocks in the pool.
        block_size: token slots per block.
        enable_prefix_caching: find full blocks again by content (needs ``token_ids``).
        num_cpu_blocks: size of the CPU swap space, in blocks.
        on_copy: called as ``on_copy(src, dst)`` whenever copy-on-write gives a sequence
            block ``dst`` in place of the shared block ``src`` (the owner copies the bytes).
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 num_cpu_blocks: int = 0, on_copy: Optional[Callable[[int, int], None]] = None) -> None:
        self.num_blocks = as_count(num_blocks, "num_blocks", minimum=1)
        self.block_size = as_count(block_size, "block_size", minimum=1)
        self.num_cpu_blocks = as_count(num_cpu_blocks, "num_cpu_blocks")
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.on_copy = on_copy
        self._blocks = [Block(i) for i in range(self.num_blocks)]
        self._free = FreeBlockQueue(self.num_blocks, range(self.num_blocks))
        self._prefix = PrefixCache()  # content key -> block (free or held); Block.block_hash mirrors it
        self._tables: Dict[int, BlockTable] = {}
        self._cpu_free: Deque[int] = deque(range(self.num_cpu_blocks))
        self._swapped: Dict[int, BlockTable] = {}  # swapped-out sequence -> table of CPU block ids
        self._copy_log: Deque[Tuple[int, int]] = deque(maxlen=4096)
        self.num_copies = 0
        self._forked: Set[int] = set()  # sequences fork gave a shared tail: only they may hold one with room

    # ------------------------------------------------------------------ what it holds
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold findable content (they count as free)."""
        return sum(1 for _, block_id in self._prefix.items() if self._blocks[block_id].ref_count == 0)

    @property
    def copy_log(self) -> Tuple[Tuple[int, int], ...]:
        """The copy-on-write copies made, ``(src, dst)`` block ids, oldest first (the last 4,096)."""
        return tuple(self._copy_log)

    @property
    def prefix_counters(self) -> Tuple[int, int]:
        """``(queries, hits)``: full prompt blocks looked up in the prefix cache, and those found."""
        return self._prefix.queries, self._prefix.hits

    @property
    def seq_ids(self) -> Tuple[int, ...]:
        """Ids of the resident sequences, oldest first."""
        return tuple(self._tables)

    @property
    def swapped_seq_ids(self) -> Tuple[int, ...]:
        return tuple(self._swapped)

    def __contains__(self, seq_id: object) -> bool:
        return type(seq_id) is not bool and (seq_id in self._tables or seq_id in self._swapped)

    def is_swapped(self, seq_id: int) -> bool:
        """Whether the sequence is swapped out (unknown ids raise)."""
        if as_seq_id(seq_id) in self._swapped:
            return True
        self.table(seq_id)
        return False

    @property
    def blocks(self) -> Tuple[Block, ...]:
        """Snapshots of every physical block, by id (copies: editing them changes nothing)."""
        return tuple(Block(b.block_id, b.ref_count, b.block_hash) for b in self._blocks)

    @property
    def free_blocks(self) -> Tuple[int, ...]:
        """Free block ids from head (handed out next) to tail."""
        return tuple(self._free)

    @property
    def sequence_block_tables(self) -> Dict[int, BlockTable]:
        """Copies of every resident sequence's block table, by sequence id, oldest first."""
        return {seq_id: table.copy() for seq_id, table in self._tables.items()}

    @property
    def swapped_block_tables(self) -> Dict[int, BlockTable]:
        """Copies of every swapped-out sequence's table (its block ids are CPU block ids)."""
        return {seq_id: table.copy() for seq_id, table in self._swapped.items()}

    @property
    def free_cpu_blocks(self) -> Tuple[int, ...]:
        """Free CPU block ids, next handed out first."""
        return tuple(self._cpu_free)

    @property
    def cached_blocks(self) -> Dict[bytes, int]:
        """A copy of the prefix cache's map: content key -> block id (free blocks included)."""
        return dict(self._prefix.items())

    def table(self, seq_id: int) -> BlockTable:
        """The live table of a resident sequence (read it, never change it); typed errors for bad ids."""
        table = self._tables.get(seq_id) if type(seq_id) is int else self._tables.get(as_seq_id(seq_id))
        if table is None:
            if seq_id in self._swapped:
                raise SequenceStateError(f"sequence {seq_id} is swapped out; swap_in({seq_id}) first")
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        return table

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's block ids, in logical order."""
        return list(self.table(seq_id).block_ids)

    def get_num_tokens(self, seq_id: int) -> int:
        """How many tokens the sequence holds (swapped out or not)."""
        table = self._swapped.get(as_seq_id(seq_id))
        return self.table(seq_id).num_tokens if table is None else table.num_tokens

    # ------------------------------------------------------------------ questions
    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        return cdiv(as_count(num_tokens, "num_tokens"), self.block_size)

    def watermark_blocks(self, watermark: float) -> int:
        """Blocks an admission must leave free: ``ceil(watermark * num_blocks)`` (typed errors for a bad watermark)."""
        return watermark_blocks(watermark, self.num_blocks)

    def blocks_to_hold(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> int:
        """The most blocks ``num_seqs`` sequences of up to ``num_tokens`` tokens may hold (private copies), the
        watermark added: the pool serves them only if this is at most ``num_blocks``."""
        return blocks_to_hold(num_tokens, num_seqs, self.block_size, self.num_blocks, watermark)

    def can_allocate(self, num_tokens: int, *, token_ids: TokenIds = None, watermark: float = 0.0,
                     extra_key: ExtraKey = None) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens fits now, cache hits counted, leaving the watermark."""
        return self.can_allocate_many([num_tokens], token_ids=[token_ids], watermark=watermark, extra_key=extra_key)

    def can_allocate_many(self, num_tokens: Sequence[int], *, token_ids: Optional[Sequence[TokenIds]] = None,
                          watermark: float = 0.0, extra_key: ExtraKey = None) -> bool:
        """Whether several new sequences (``num_tokens[i]`` tokens each) fit now together, leaving the watermark.

        Cache hits are counted per sequence against today's cache, a free cached block once however
        many of them hit it; blocks one of them would find in another's fresh blocks are not counted
        (the answer may say no where allocating one by one would fit, never yes where it would not).
        """
        lengths = [as_count(n, "num_tokens") for n in as_iterable(num_tokens, "num_tokens")]
        tokens = [None] * len(lengths) if token_ids is None else list(as_iterable(token_ids, "token_ids"))
        if len(tokens) != len(lengths):
            raise InvalidArgumentError(f"got {len(tokens)} token_ids for {len(lengths)} sequences")
        reserve = self.watermark_blocks(watermark)
        new_blocks = 0
        revived: Set[int] = set()  # free cached blocks some sequence hits: taken off the free queue once
        for n, ids in zip(lengths, tokens):
            plan = self._plan_prompt(n, ids, extra_key)
            new_blocks += plan.new_blocks
            revived.update(b for b in plan.hits if self._blocks[b].ref_count == 0)
        return len(self._free) - new_blocks - len(revived) >= reserve

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks ``append_tokens(seq_id, num_tokens)`` would take now: new blocks, plus one to copy
        a shared, non-full last block. For this sequence alone (:meth:`can_append` counts shared tails once)."""
        return growth_demand([self.table(seq_id)], as_count(num_tokens, "num_tokens"), self.block_size,
                             self._blocks)

    def can_append(self, seq_ids: Iterable[int], num_tokens: int = 1, *, watermark: float = 0.0) -> bool:
        """Whether every listed sequence can grow by ``num_tokens`` in the same step, leaving the watermark.
        Unknown, swapped-out or repeated ids raise."""
        num_tokens = as_count(num_tokens, "num_tokens")
        reserve = self.watermark_blocks(watermark)
        tables = [self._tables[s] for s in self._listed(seq_ids, "can_append")]
        return len(self._free) - growth_demand(tables, num_tokens, self.block_size, self._blocks) >= reserve

    def cached_prefix_tokens(self, token_ids: Sequence[int], *, extra_key: ExtraKey = None) -> int:
        """How many leading tokens of a prompt the prefix cache holds now (whole blocks); changes nothing."""
        if not hasattr(token_ids, "__len__"):
            raise InvalidArgumentError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
        return len(self._plan_prompt(len(token_ids), token_ids, extra_key).hits) * self.block_size

    # ------------------------------------------------------------------ admit a prompt
    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int, *, token_ids: TokenIds = None,
                              extra_key: ExtraKey = None) -> int:
        """Give a new sequence the blocks for its prompt; returns how many prompt tokens were found cached.

        With ``token_ids`` (and prefix caching on) the longest run of leading full blocks whose content
        is cached is reused, not allocated. ``extra_key`` salts every key: different salts never share.
        """
        seq_id = as_seq_id(seq_id)
        num_prompt_tokens = as_count(num_prompt_tokens, "num_prompt_tokens")
        self._check_new_id(seq_id)
        plan = self._plan_prompt(num_prompt_tokens, token_ids, extra_key)
        if plan.new_blocks + plan.hit_free > len(self._free):
            raise OutOfBlocksError(plan.new_blocks, len(self._free) - plan.hit_free, f"allocate sequence {seq_id}")
        return self._admit(seq_id, num_prompt_tokens, plan)

    def allocate_prompt(self, seq_id: int, prompt: Sequence[int], *, max_new_tokens: Optional[int] = None,
                        watermark: float = 0.0, extra_key: ExtraKey = None) -> Optional[int]:
        """The scheduler's one call per prompt chunk: place the prompt's next tokens, up to ``max_new_tokens`` of them
        (all by default), leaving the watermark free. A new sequence is admitted with its cached prefix and the
        tokens after it, all or nothing; a resident one, holding the prompt's first tokens, grows by as many of the
        next ones as fit. Returns how many of its tokens were in place before (found cached, or held), or ``None``
        (nothing changed) when none fit; the sequence then holds :meth:`get_num_tokens` tokens."""
        seq_id = as_seq_id(seq_id)
        if not hasattr(prompt, "__len__"):
            raise InvalidTypeError(f"prompt must be a sequence of token ids, got {type(prompt).__name__}")
        left = len(prompt) if max_new_tokens is None else as_count(max_new_tokens, "max_new_tokens")
        reserve = self.watermark_blocks(watermark)
        table = self._tables.get(seq_id)
        if table is not None:  # the next chunk: as much of it as fits, its tokens checked by append_tokens
            held = table.num_tokens
            if held > len(prompt) or table.token_ids is not None and table.token_ids != list(prompt[:held]):
                raise InvalidArgumentError(f"sequence {seq_id} holds tokens that do not begin this prompt")
            n = room_to_grow(table, min(left, len(prompt) - held), len(self._free) - reserve, self.block_size,
                             self._blocks)
            if n == 0:
                return None
            self.append_tokens(seq_id, n, prompt[held : held + n])
            return held
        self._check_new_id(seq_id)
        plan = self._plan_prompt(len(prompt), prompt, extra_key)
        cached = len(plan.hits) * self.block_size
        total = min(len(prompt), cached + left)
        full = total // self.block_size  # the plan of the placed part: its full blocks' keys, the same hits
        plan = plan._replace(tokens=None if plan.tokens is None else plan.tokens[:total], keys=plan.keys[:full],
                             new_blocks=cdiv(total, self.block_size) - len(plan.hits))
        if len(self._free) - plan.new_blocks - plan.hit_free < reserve:
            return None
        return self._admit(seq_id, total, plan)

    def _admit(self, seq_id: int, num_tokens: int, plan: PromptPlan) -> int:
        """Allocate a new sequence's prompt as planned (the blocks are there); returns the tokens found cached."""
        self._prefix.queries += len(plan.keys)
        self._prefix.hits += len(plan.hits)
        for block_id in plan.hits:
            if self._blocks[block_id].ref_count == 0:
                self._free.remove(block_id)
            self._blocks[block_id].ref_count += 1
        table = BlockTable(plan.hits + self._take(plan.new_blocks), num_tokens, plan.tokens, plan.keys, plan.salt)
        self._register(table, len(plan.hits))
        self._tables[seq_id] = table
        return len(plan.hits) * self.block_size

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Make ``child_seq_id`` share every block of ``parent_seq_id`` (ref counts go up; nothing is copied)."""
        parent = self.table(parent_seq_id)
        child_seq_id = as_seq_id(child_seq_id)
        self._check_new_id(child_seq_id)
        for block_id in parent.block_ids:
            self._blocks[block_id].ref_count += 1
        self._tables[child_seq_id] = parent.copy()
        self._forked.update((as_seq_id(parent_seq_id), child_seq_id))

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks (resident or swapped out); an unknown id is a no-op, as in the seed.

        A block nobody else holds goes back to the free queue keeping its content key (still findable).
        """
        if type(seq_id) is not int:
            seq_id = as_seq_id(seq_id)
        self._forked.discard(seq_id)
        table = self._tables.pop(seq_id, None)
        if table is not None:
            self._release(table.block_ids)
        elif seq_id in self._swapped:
            self._cpu_free.extend(self._swapped.pop(seq_id).block_ids)

    # ------------------------------------------------------------------ grow
    def allocate_slots(self, seq_ids: Iterable[int], num_tokens: int = 1, *,
                       token_ids: Optional[Sequence[TokenRow]] = None, watermark: float = 0.0) -> Optional[Placed]:
        """The scheduler's one call per decode step (vLLM's ``allocate_slots``): grow every listed sequence by
        ``num_tokens``, leaving the watermark free, and return ``{seq_id: block ids placed}`` for those that
        got a new or copied block; or return ``None``, changing nothing, when they do not all fit.

        ``token_ids[i]`` are sequence ``i``'s new tokens (for one token, the bare token will do), so blocks that fill
        up become cacheable (keyed once, when they fill). Bad arguments raise typed errors, changing nothing. The
        result is what one ``append_tokens`` per sequence, in the listed order, would do.
        """
        reserve = 0 if type(watermark) is float and watermark == 0.0 else self.watermark_blocks(watermark)
        return self._grow_listed(seq_ids, num_tokens, token_ids, reserve)[0]

    def append_tokens_batch(self, seq_ids: Iterable[int], num_tokens: int = 1, *,
                            token_ids: Optional[Sequence[TokenRow]] = None) -> Placed:
        """:meth:`allocate_slots` that raises :class:`OutOfBlocksError` (changing nothing) when they do not fit."""
        placed, ids = self._grow_listed(seq_ids, num_tokens, token_ids, 0)
        if placed is None:
            needed = growth_demand([self._tables[s] for s in ids], num_tokens, self.block_size, self._blocks)
            raise OutOfBlocksError(needed, len(self._free), f"grow {len(ids)} sequences by {num_tokens}")
        return placed

    def append_tokens(self, seq_id: int, num_tokens: int = 1, token_ids: TokenIds = None) -> Tuple[int, ...]:
        """Grow a sequence by ``num_tokens``, adding exactly the blocks it now needs; returns the block ids placed.

        A new block is needed when the first new token's position is a multiple of ``block_size`` (the
        seed's ``(length + 1) % block_size == 0`` asked one token early). A shared, non-full last block is
        copied first (copy-on-write). ``token_ids`` (the new tokens) make blocks that fill up cacheable; it is
        not keyword-only because CPython calls a function that has keyword-only parameters more slowly.
        """
        try:
            table = self._tables[seq_id] if type(seq_id) is int else self.table(seq_id)
        except KeyError:
            table = self.table(seq_id)  # raises the typed error
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_count(num_tokens, "num_tokens")
        if token_ids is None and table.token_ids is None and seq_id not in self._forked:
            # Most calls: no content to key and no fork sharing the last block (see _grow), so the sequence takes
            # new blocks for the tokens past the capacity of those it holds, and nothing else.
            count = table.num_tokens + num_tokens
            if count % self.block_size > num_tokens or cdiv(count, self.block_size) <= len(table.block_ids):
                table.num_tokens = count  # they end mid-block (the first test, most calls), or its blocks hold them
                return ()
            short = cdiv(count, self.block_size) - len(table.block_ids)
            if short > len(self._free):
                raise OutOfBlocksError(short, len(self._free), f"grow sequence {seq_id} to {count} tokens")
            new = self._take(short)
            table.block_ids += new
            table.num_tokens = count
            return tuple(new)
        row = None if token_ids is None else as_token_ids(token_ids, num_tokens)
        placed = self._grow((seq_id,), num_tokens, row if row is None or num_tokens == 1 else [row], 0)  # 1: flat
        if placed is None:
            raise OutOfBlocksError(self.blocks_to_append(seq_id, num_tokens), len(self._free),
                                   f"grow sequence {seq_id} to {table.num_tokens + num_tokens} tokens")
        return placed.get(seq_id, ())

    def append_block_to_sequence(self, seq_id: int) -> int:
        """The seed's low-level step: reserve one more (empty) block for a sequence whose blocks are full.

        Refused while the last block has room (it would sit empty). Returns the new block id.
        """
        table = self.table(seq_id)
        if table.num_tokens < len(table.block_ids) * self.block_size:
            raise SequenceStateError(f"sequence {seq_id} still has room: {table.num_tokens} tokens in "
                                     f"{len(table.block_ids)} blocks of {self.block_size}")
        if not self._free:
            raise OutOfBlocksError(1, 0, f"append a block to sequence {seq_id}")
        (block_id,) = self._take(1)
        table.append_block(block_id)
        return block_id

    def make_writable(self, seq_id: int, logical_blocks: Iterable[int]) -> Tuple[Tuple[int, int], ...]:
        """Before a write into these logical blocks, copy each one other tables hold (all or none: refused
        when too few blocks are free); returns the copies ``(src, dst)``."""
        table = self.table(seq_id)
        shared = [i for i in sorted(set(logical_blocks)) if self._blocks[table.block_ids[i]].ref_count > 1]
        if len(shared) > len(self._free):
            raise OutOfBlocksError(len(shared), len(self._free), f"copy shared blocks of sequence {seq_id}")
        return tuple(self._copy_on_write(table, i) for i in shared)

    # ------------------------------------------------------------------ swap
    def swap_out(self, *seq_ids: int) -> Optional[Tuple[List[int], List[int]]]:
        """Move these resident sequences to the CPU pool, all or none: each gets a private CPU block per block it
        holds and drops its device blocks (shared ones stay for their other holders). Returns ``(device_ids,
        cpu_ids)``, for the owner to copy ``device_ids[i]`` to ``cpu_ids[i]`` at once, or ``None`` (nothing
        changed) when the CPU pool cannot hold them all. Unknown, swapped-out or repeated ids raise."""
        tables = [self._tables[s] for s in self._listed(seq_ids, "swap_out")]
        if sum(len(table.block_ids) for table in tables) > len(self._cpu_free):
            return None
        device_ids: List[int] = []
        for seq_id, table in zip(seq_ids, tables):
            del self._tables[seq_id]
            self._release(table.block_ids)
            device_ids += table.block_ids
            table.block_ids = [self._cpu_free.popleft() for _ in table.block_ids]
            self._swapped[seq_id] = table
        return device_ids, [b for table in tables for b in table.block_ids]

    def swap_in(self, *seq_ids: int, watermark: float = 0.0) -> Optional[Tuple[List[int], List[int]]]:
        """Bring these swapped-out sequences back onto fresh device blocks, all or none, leaving the watermark free;
        returns ``(cpu_ids, device_ids)`` to copy, or ``None`` (nothing changed) when they do not fit."""
        tables = [self._swapped_table(s) for s in seq_ids]
        if len(set(map(id, tables))) < len(tables):
            raise InvalidArgumentError(f"a sequence is listed twice in swap_in{seq_ids}")
        if len(self._free) - sum(len(table.block_ids) for table in tables) < self.watermark_blocks(watermark):
            return None
        cpu_ids: List[int] = []
        for seq_id, table in zip(map(as_seq_id, seq_ids), tables):
            del self._swapped[seq_id]
            cpu_ids += table.block_ids
            self._cpu_free.extend(table.block_ids)
            table.block_ids = self._take(len(table.block_ids))
            self._register(table, 0)
            self._tables[seq_id] = table
        return cpu_ids, [b for table in tables for b in table.block_ids]

    def reset_prefix_cache(self) -> int:
        """Forget every cached block's content key (after new weights); refused while any block is in use."""
        if self.num_used_blocks:
            raise BlocksInUseError(f"cannot reset the prefix cache: {self.num_used_blocks} blocks are in use")
        dropped = len(self._prefix)
        for _, block_id in list(self._prefix.items()):
            self._blocks[block_id].block_hash = None
        self._prefix.clear()
        return dropped

    # ------------------------------------------------------------------ inspection
    def stats(self) -> AllocatorStats:
        """Block counts, tokens stored (distinct filled slots, a shared block's fullest use once), utilization
        and sharing counters; ``logical_tokens`` counts every sequence's tokens."""
        fill: Dict[int, int] = {}
        for table in self._tables.values():
            for block_id, here in zip(table.block_ids, tokens_in_blocks(table.num_tokens, len(table),
                                                                         self.block_size)):
                fill[block_id] = max(here, fill.get(block_id, 0))
        used, stored = self.num_used_blocks, sum(fill.values())
        return AllocatorStats(
            self.num_blocks, len(self._free), used, len(self._tables), stored,
            sum(t.num_tokens for t in self._tables.values()), stored / (used * self.block_size) if used else 0.0,
            self.num_cached_free_blocks, self._prefix.queries, self._prefix.hits, self.num_copies,
            len(self._swapped), len(self._cpu_free), self.num_cpu_blocks)

    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` naming the first inconsistency (it never should find one).

        free + used == total and a block is either free (maybe still cached) or held; its ref count is
        the number of resident tables holding it; it carries a hash exactly when the prefix cache maps
        that hash to it, and a held block with a hash is full in every table; a table holds
        ``ceil(tokens / block_size)`` blocks, or one more (an empty reserve after a full last block),
        and token ids and keys that match its count; a last block with room that other tables hold belongs to a
        forked sequence; each CPU block is free or held by one swapped table.
        """
        try:
            self._free.check()
        except AssertionError as exc:
            raise InvariantError(f"free queue: {exc}") from None
        holders, full_in_all = [0] * self.num_blocks, [True] * self.num_blocks
        for seq_id, table in chain(self._tables.items(), self._swapped.items()):
            least = cdiv(table.num_tokens, self.block_size)
            if not least <= len(table.block_ids) <= least + 1:
                raise InvariantError(f"sequence {seq_id} has {table.num_tokens} tokens in {len(table)} blocks")
            if len(table.block_ids) == least + 1 and table.num_tokens % self.block_size:
                raise InvariantError(f"sequence {seq_id} reserved a block while its last one has room")
            if table.token_ids is not None and len(table.token_ids) != table.num_tokens:
                raise InvariantError(f"sequence {seq_id} holds {len(table.token_ids)} token ids for "
                                     f"{table.num_tokens} tokens")
            if table.token_ids is not None and len(table.block_keys) != table.num_tokens // self.block_size:
                raise InvariantError(f"sequence {seq_id} has {len(table.block_keys)} keys for its full blocks")
        for table in self._tables.values():
            for i, block_id in enumerate(table.block_ids):
                holders[block_id] += 1
                full_in_all[block_id] &= (i + 1) * self.block_size <= table.num_tokens
        for block in self._blocks:
            if block.ref_count != holders[block.block_id]:
                raise InvariantError(f"block {block.block_id} has ref_count {block.ref_count} but "
                                     f"{holders[block.block_id]} tables hold it")
            if (block.block_id in self._free) == (block.ref_count > 0):
                state = "queued as free" if block.ref_count else "missing from the free queue"
                raise InvariantError(f"block {block.block_id} has ref_count {block.ref_count} but is {state}")
            if block.block_hash is not None and self._prefix.get(block.block_hash) != block.block_id:
                raise InvariantError(f"block {block.block_id} has a hash the prefix cache does not map to it")
            if block.block_hash is not None and block.ref_count and not full_in_all[block.block_id]:
                raise InvariantError(f"block {block.block_id} carries a hash but is not full")
        for seq_id, t in self._tables.items():  # growth asks forked sequences alone about copy-on-write
            shared_tail = t.num_tokens < len(t) * self.block_size and self._blocks[t.block_ids[-1]].ref_count > 1
            if shared_tail and seq_id not in self._forked:
                raise InvariantError(f"sequence {seq_id} shares its last block with room but never forked")
        for key, block_id in self._prefix.items():
            if self._blocks[block_id].block_hash != key:
                raise InvariantError(f"prefix cache maps a key to block {block_id}, which has another hash")
        cpu_used = [b for t in self._swapped.values() for b in t.block_ids]
        if len(set(cpu_used)) != len(cpu_used) or set(cpu_used) & set(self._cpu_free):
            raise InvariantError("a CPU block is held twice, or held and free")
        if len(cpu_used) + len(self._cpu_free) != self.num_cpu_blocks:
            raise InvariantError("CPU free + used blocks != total")
        if set(self._tables) & set(self._swapped):
            raise InvariantError("a sequence is both resident and swapped out")

    # ------------------------------------------------------------------ internals
    def _grow_listed(self, seq_ids: Iterable[int], num_tokens: int, token_ids: Optional[Sequence[TokenRow]],
                     reserve: int) -> Tuple[Optional[Placed], Sequence[int]]:
        """Check a growth call's arguments (ids, count, token ids), then :meth:`_grow` them; returns the ids too."""
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_count(num_tokens, "num_tokens")
        ids = self._listed(seq_ids, "allocate_slots")
        tokens = None
        if token_ids is not None:
            if len(token_ids) != len(ids):
                raise InvalidArgumentError(f"token_ids has {len(token_ids)} entries for {len(ids)} sequences")
            tokens = self._token_rows(token_ids, num_tokens)
        return self._grow(ids, num_tokens, tokens, reserve), ids

    def _grow(self, ids: Sequence[int], num_tokens: int, tokens: Optional[List[Any]],
              reserve: int) -> Optional[Placed]:
        """Grow the tables of checked ids in listed order, if what that takes leaves ``reserve`` blocks free: copy a
        shared last block, take new blocks, count the tokens, key the blocks that fill. Returns the blocks placed,
        or ``None`` (nothing changed) when refused.

        Decided before it changes anything: a table takes at most ``cdiv(num_tokens - 1, block_size) + 1`` blocks
        (new ones past its capacity, after a copy of a shared tail with room), so while the free queue holds that
        many for every table the step fits; only when it may not does :func:`growth_demand` count it exactly.
        """
        block_size, blocks, tables, spare = self.block_size, self._blocks, self._tables, len(self._free) - reserve
        if spare < len(ids) * (cdiv(num_tokens - 1, block_size) + 1) and \
                spare < growth_demand([tables[s] for s in ids], num_tokens, block_size, blocks):
            return None
        placed: Placed = {}
        forked, fits = self._forked, block_size - num_tokens
        # A table with 1..fits tokens in a last block no fork shares takes a count update; others ask _place.
        if tokens is None:  # the content is unknown from here on: no more keys
            for seq_id in ids:
                table = tables[seq_id]
                count = table.num_tokens
                if (count - 1) % block_size >= fits or (forked and seq_id in forked):
                    got = self._place(table, num_tokens)
                    if got:
                        placed[seq_id] = got
                table.num_tokens = count + num_tokens
                table.token_ids = None
        elif num_tokens == 1:  # a decode step: one token (or None, unknown) each; a block that fills is keyed once
            for seq_id, token in zip(ids, tokens):
                table = tables[seq_id]
                count = table.num_tokens
                if count % block_size == 0 or (forked and seq_id in forked):
                    got = self._place(table, 1)
                    if got:
                        placed[seq_id] = got
                table.num_tokens = count = count + 1
                seen = table.token_ids
                if seen is not None and token is not None:
                    seen.append(token)
                    if count % block_size == 0:
                        self._register(table, len(table.block_keys))
                elif seen is not None:
                    table.token_ids = None
        else:  # several tokens with their ids (a prompt's next chunk): the general rule for each
            for seq_id, new in zip(ids, tokens):
                table = tables[seq_id]
                got = self._place(table, num_tokens)
                if got:
                    placed[seq_id] = got
                table.num_tokens += num_tokens
                if table.token_ids is None or new is None:
                    table.token_ids = None
                else:
                    table.token_ids += new
                    self._register(table, len(table.block_keys))
        return placed

    def _place(self, table: BlockTable, num_tokens: int) -> Tuple[int, ...]:
        """The blocks a table takes to grow by ``num_tokens``: a copy of its shared last block with room, then new
        blocks for the tokens past its capacity (none when it holds its last block alone and the tokens fit;
        the last holder of a shared tail writes in place)."""
        ids = table.block_ids
        room = len(ids) * self.block_size - table.num_tokens
        got: Tuple[int, ...] = ()
        if room and num_tokens and self._blocks[ids[-1]].ref_count > 1:
            got = (self._copy_on_write(table, len(ids) - 1)[1],)
        if num_tokens > room:
            new = self._take(cdiv(num_tokens - room, self.block_size))
            ids += new
            got += tuple(new)
        return got

    def _token_rows(self, token_ids: Sequence[TokenRow], num_tokens: int) -> Optional[List[Any]]:
        """Each sequence's new token ids, checked (``num_tokens`` ints in 64 bits, or ``None``), or ``None`` for all
        when prefix caching is off. For one token each (a decode step) a row may be the bare token, and the rows
        come back flat: one int (or ``None``) per sequence. Plain ints are checked at C speed."""
        rows: List[Any] = token_ids if type(token_ids) is list else list(token_ids)
        try:
            flat: List[Any] = (rows if set(map(type, rows)) <= INT else [t for (t,) in rows]) if num_tokens == 1 \
                else list(chain.from_iterable(rows)) if set(map(len, rows)) <= {num_tokens} else [None]
            if flat is rows or set(map(type, flat)) <= INT:  # no bools, no tensors
                array("q", flat)  # every one in 64 bits
                return None if not self.enable_prefix_caching else flat if num_tokens == 1 else rows
        except (TypeError, ValueError, OverflowError):
            pass
        rows = [None if t is None else as_token_ids(t if hasattr(t, "__len__") else [t], num_tokens) for t in rows]
        flat = [None if t is None else t[0] for t in rows] if num_tokens == 1 else rows
        return flat if self.enable_prefix_caching else None

    def _listed(self, seq_ids: Iterable[int], call: str) -> Sequence[int]:
        """A call's sequence ids, checked: ints, distinct, resident (typed errors)."""
        ids: Any = seq_ids if type(seq_ids) in (list, tuple) else tuple(as_iterable(seq_ids, "seq_ids"))
        try:  # the ids that are resident tables' keys, counted once each: all of them when all are good
            if len(self._tables.keys() & ids) == len(ids) and set(map(type, ids)) <= INT:
                return ids
        except TypeError:
            pass
        seen = set()
        for seq_id in ids:
            self.table(seq_id)
            if type(seq_id) is not int:
                raise InvalidTypeError(f"seq_id must be an int, got {type(seq_id).__name__} {seq_id!r}")
            if seq_id in seen:
                raise InvalidArgumentError(f"sequence {seq_id} is listed twice in {call}")
            seen.add(seq_id)
        raise AssertionError("unreachable: one of the ids is bad")

    def _plan_prompt(self, num_tokens: int, token_ids: TokenIds, extra_key: ExtraKey) -> PromptPlan:
        """What allocating a prompt would take (keys, cache hits, blocks from the free queue); changes nothing.
        Token ids are checked, and count only with prefix caching on."""
        tokens = None if token_ids is None else as_token_ids(token_ids, num_tokens)
        tokens = tokens if self.enable_prefix_caching else None
        salt = as_extra_key(extra_key)
        keys = chain_keys(tokens, self.block_size, salt) if tokens is not None else []
        hits = self._prefix.longest_prefix(keys)
        hit_free = sum(1 for b in hits if self._blocks[b].ref_count == 0)
        return PromptPlan(tokens, salt, keys, hits, hit_free, cdiv(num_tokens, self.block_size) - len(hits))

    def _take(self, n: int) -> List[int]:
        """Pop ``n`` blocks off the free queue, each now held once; the cached content they held is evicted."""
        ids = [self._free.popleft()] if n == 1 else self._free.pop_many(n)  # most takes are one block
        for block_id in ids:
            block = self._blocks[block_id]
            block.ref_count = 1
            if block.block_hash is not None:
                del self._prefix[block.block_hash]
                block.block_hash = None
        return ids

    def _release(self, block_ids: List[int]) -> None:
        """Drop one reference to each block; those nobody holds join the free queue tail block first (so tail
        blocks are reused before head blocks, which a later prompt is likelier to share)."""
        released = []
        for block_id in reversed(block_ids):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                released.append(block_id)
        self._free.extend_unchecked(released)

    def _register(self, table: BlockTable, start: int) -> None:
        """Make the table's full blocks from logical index ``start`` on findable by content, keying first the
        blocks filled since its last key (a block is keyed once, when it fills)."""
        seen = table.token_ids
        if seen is None:
            return
        keys, ids, blocks, prefix, size = table.block_keys, table.block_ids, self._blocks, self._prefix, self.block_size
        for i in range(start, len(seen) // size):
            if i == len(keys):
                keys.append(block_key(keys[-1] if i else None, seen[i * size:(i + 1) * size], table.extra_key))
            block = blocks[ids[i]]
            if block.block_hash is None and keys[i] not in prefix:
                block.block_hash = keys[i]
                prefix[keys[i]] = ids[i]

    def _copy_on_write(self, table: BlockTable, index: int) -> Tuple[int, int]:
        """Give the table a private copy of its shared block at logical ``index``; returns ``(src, dst)``. If
        ``on_copy`` raises, the fresh block goes back to the head of the free queue and the table keeps src."""
        src = table.block_ids[index]
        (dst,) = self._take(1)
        try:
            if self.on_copy is not None:
                self.on_copy(src, dst)
        except BaseException:
            self._blocks[dst].ref_count = 0
            self._free.appendleft(dst)
            raise
        self._blocks[src].ref_count -= 1
        table.block_ids[index] = dst
        self._copy_log.append((src, dst))
        self.num_copies += 1
        return (src, dst)

    def _swapped_table(self, seq_id: int) -> BlockTable:
        table = self._swapped.get(as_seq_id(seq_id))
        if table is None:
            self.table(seq_id)
            raise SequenceStateError(f"sequence {seq_id} is not swapped out")
        return table

    def _check_new_id(self, seq_id: int) -> None:
        if seq_id in self._tables or seq_id in self._swapped:
            raise DuplicateSequenceError(f"sequence {seq_id} is already allocated")
