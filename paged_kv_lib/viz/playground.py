"""The playground: buttons that drive a real allocator, with every view redrawn after each click.

Learners add sequences, append tokens, fork and free, and watch blocks move between the
pool, the block tables and the free queue. Each action writes one line to a log; an
action the allocator refuses (out of blocks, unknown sequence...) shows the error's
message there and changes nothing, exactly as the library promises.
"""

from __future__ import annotations

import html
import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ipywidgets as widgets

from ..allocator import PagedKVCacheAllocator
from ..errors import OutOfBlocksError
from . import snapshot
from .colors import ERROR_TEXT, MUTED_TEXT_SHORT, OK_TEXT
from .static import widget_bundle
from .svg import count
from .views import AddressTranslationView, BlockTableView, FreeQueueView

OK, ERROR = "ok", "error"


def _accepts_keyword(method: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


# Token ids are vocabulary indices: whole numbers from 0 to this (what an int32 id tensor holds).
MAX_TOKEN_ID = 2**31 - 1


def _whole_number(word: str) -> Optional[int]:
    word = word.strip()
    return int(word) if word.isascii() and word.isdigit() else None


def parse_count(text: Any, what: str) -> int:
    """A box's text as a count of tokens: ``"12"`` -> 12; ``"2.5"``, ``"-5"`` or ``"x"`` -> ValueError, in words."""
    value = text if type(text) is int else _whole_number(str(text))
    if value is None or value < 0:
        raise ValueError(f"{what} must be a whole number of tokens, 0 or more; got {str(text).strip()!r}")
    return value


def parse_token_ids(text: str) -> Optional[List[int]]:
    """``"1 2, 3"`` -> ``[1, 2, 3]``; blank -> ``None`` (no token ids, just a count)."""
    words = text.replace(",", " ").split()
    if not words:
        return None
    ids = []
    for word in words:
        value = _whole_number(word)
        if value is None:
            raise ValueError(f"token ids must be whole numbers (0 or more) separated by spaces; {word!r} is not")
        if value > MAX_TOKEN_ID:
            raise ValueError(f"token id {word} is too large: ids run from 0 to {MAX_TOKEN_ID}")
        ids.append(value)
    return ids


class Playground:
    """Drive a :class:`~paged_kv_lib.PagedKVCacheAllocator` with buttons and watch it work.

    Pass your own allocator (or let the playground make a small one) and keep a handle on
    it: ``pg.allocator`` is the very object the buttons change, so you can inspect it, or
    change it from code and call ``pg.refresh()``. Every button has a method twin
    (:meth:`add_sequence`, :meth:`append`, :meth:`fork`, :meth:`free`, :meth:`swap_out`,
    :meth:`swap_in`) that logs the same way. The default allocator has a CPU swap pool as
    big as its device pool (``num_cpu_blocks``), so swapping works out of the box.

    Example::

        from paged_kv_lib.viz import Playground

        pg = Playground(num_blocks=16, block_size=4)
        pg                                   # the controls and the live views
        pg.add_sequence(10)                  # same as typing 10 and clicking "add sequence"
        pg.allocator.get_block_mapping(0)    # the real allocator behind it
        pg.log[-1]                           # "added seq 0: 10 tokens -> blocks [0, 1, 2]"
    """

    def __init__(
        self,
        allocator: Optional[PagedKVCacheAllocator] = None,
        *,
        num_blocks: int = 16,
        block_size: int = 4,
        num_heads: int = 1,
        head_dim: int = 4,
        num_cpu_blocks: Optional[int] = None,
        columns: int = 16,
        max_log_lines: int = 8,
    ) -> None:
        self._factory: Optional[Callable[[], PagedKVCacheAllocator]] = None
        if allocator is None:
            cpu = num_blocks if num_cpu_blocks is None else num_cpu_blocks

            def factory() -> PagedKVCacheAllocator:
                return PagedKVCacheAllocator(num_blocks, block_size, num_heads, head_dim, num_cpu_blocks=cpu)

            self._factory = factory
            allocator = factory()
        self.allocator = allocator
        self.max_log_lines = max_log_lines
        self._entries: List[Tuple[str, str]] = []
        self._selected: Optional[int] = None  # the sequence the dropdown should show next
        self._next_seq_id = max(self._all_seq_ids(), default=-1) + 1

        self.block_table = BlockTableView(allocator, columns=columns)
        self.free_queue = FreeQueueView(allocator, columns=columns)
        self.translation = AddressTranslationView(allocator, columns=columns)
        self._build_controls()
        self.widget = self._build_layout()
        self.refresh()

    def _build_controls(self) -> None:
        narrow = {"description_width": "initial"}
        # Text boxes, not IntText: the program reads what was typed and refuses "2.5" or "-5" in words.
        self.prompt_tokens = widgets.Text(
            value=str(2 * self.allocator.block_size + 1), description="prompt tokens",
            style=narrow, layout=widgets.Layout(width="170px"))
        self.token_ids = widgets.Text(
            value="", placeholder="optional: token ids, e.g. 1 2 3 4 5", description="token ids",
            style=narrow, layout=widgets.Layout(width="330px"),
            tooltip="With prefix caching, prompts that share token ids share full blocks")
        self.add_button = widgets.Button(description="add sequence", button_style="primary",
                                         tooltip="allocate a new sequence for the prompt", icon="plus")
        self.seq_select = widgets.Dropdown(description="sequence", style=narrow,
                                           layout=widgets.Layout(width="240px"))
        self.num_tokens = widgets.Text(value="1", description="tokens", style=narrow,
                                       layout=widgets.Layout(width="110px"))
        self.append_button = widgets.Button(description="append tokens", tooltip="grow the sequence (decode)")
        self.fork_button = widgets.Button(description="fork", tooltip="a child sequence sharing every block")
        self.free_button = widgets.Button(description="free", button_style="danger",
                                          tooltip="release the sequence's blocks")
        self.swap_out_button = widgets.Button(description="swap out", tooltip="move the sequence to the CPU pool")
        self.swap_in_button = widgets.Button(description="swap in", tooltip="bring it back to device blocks")
        self.reset_button = widgets.Button(description="reset", icon="undo",
                                           tooltip="start again: every sequence freed, log cleared")
        self.log_html = widgets.HTML(value="")
        for control, cls in (
            (self.add_button, "pkv-add"), (self.append_button, "pkv-append"), (self.fork_button, "pkv-fork"),
            (self.free_button, "pkv-free"), (self.swap_out_button, "pkv-swap-out"),
            (self.swap_in_button, "pkv-swap-in"), (self.reset_button, "pkv-reset"),
            (self.prompt_tokens, "pkv-prompt-tokens"),
            (self.token_ids, "pkv-token-ids"), (self.num_tokens, "pkv-num-tokens"),
            (self.seq_select, "pkv-seq-select"), (self.log_html, "pkv-log"),
        ):
            control.add_class(cls)
        for button in (self.add_button, self.append_button, self.fork_button, self.free_button,
                       self.swap_out_button, self.swap_in_button, self.reset_button):
            button.layout = widgets.Layout(width="auto", min_width="72px")
        self.add_button.on_click(lambda _: self._add_from_controls())
        self.append_button.on_click(lambda _: self._append_from_controls())
        self.reset_button.on_click(lambda _: self.reset())
        self.fork_button.on_click(lambda _: self.fork(self.seq_select.value))
        self.free_button.on_click(lambda _: self.free(self.seq_select.value))
        self.swap_out_button.on_click(lambda _: self.swap_out(self.seq_select.value))
        self.swap_in_button.on_click(lambda _: self.swap_in(self.seq_select.value))

    def _build_layout(self) -> widgets.VBox:
        row = [self.seq_select, self.num_tokens, self.append_button, self.fork_button, self.free_button]
        if hasattr(self.allocator, "swap_out"):
            row += [self.swap_out_button, self.swap_in_button]
        # The translation view starts folded: the block tables and free queue are the story here.
        self.translation_panel = widgets.Accordion(children=[self.translation.widget()], selected_index=None)
        self.translation_panel.set_title(0, "address translation: pick a sequence and a token")
        box = widgets.VBox(
            [
                widgets.HBox([self.prompt_tokens, self.token_ids, self.add_button, self.reset_button],
                             layout=widgets.Layout(flex_flow="row wrap")),
                widgets.HBox(row, layout=widgets.Layout(flex_flow="row wrap")),
                self.log_html,
                self.block_table.widget(),
                self.free_queue.widget(),
                self.translation_panel,
            ],
            layout=widgets.Layout(overflow="auto", max_width="100%"),
        )
        box.add_class("pkv-playground")
        return box

    # ------------------------------------------------------------------ actions
    def add_sequence(self, num_tokens: Optional[int] = None, *, token_ids: Optional[Sequence[int]] = None,
                     seq_id: Optional[int] = None) -> Optional[int]:
        """Allocate a new sequence (next free id unless ``seq_id``); returns its id, or ``None`` if refused.

        With ``token_ids`` the prompt is those tokens (their count is the length), so an
        allocator with prefix caching can reuse blocks of an earlier identical prefix.
        """
        sid = self._next_seq_id if seq_id is None else seq_id

        def act() -> str:
            n = len(token_ids) if token_ids is not None else num_tokens
            if token_ids is not None and num_tokens is not None and num_tokens != len(token_ids):
                raise ValueError(f"num_tokens={num_tokens} but {len(token_ids)} token ids were given")
            if n is None:
                raise ValueError("give a number of prompt tokens or token ids")
            kwargs = self._token_kwargs(self.allocator.allocate_for_sequence, token_ids)
            hit = self.allocator.allocate_for_sequence(sid, n, **kwargs)
            self._next_seq_id = max(self._next_seq_id, sid + 1)
            self._selected = sid
            text = f"added seq {sid}: {n} tokens -> blocks {self.allocator.get_block_mapping(sid)}"
            if hit:
                text += f" ({hit} prompt tokens found in the prefix cache)"
            return text

        return sid if self._run(act) else None

    def append(self, seq_id: Optional[int], num_tokens: int = 1, *,
               token_ids: Optional[Sequence[int]] = None) -> bool:
        """Grow a sequence by ``num_tokens`` (or by ``token_ids``); returns whether it worked."""
        def act() -> str:
            self._need_seq(seq_id)
            n = len(token_ids) if token_ids is not None else num_tokens
            before = self.allocator.get_block_mapping(seq_id)
            kwargs = self._token_kwargs(self.allocator.append_tokens, token_ids)
            new = self.allocator.append_tokens(seq_id, n, **kwargs)
            after = self.allocator.get_block_mapping(seq_id)
            text = f"seq {seq_id}: +{n} tokens ({self.allocator.get_num_tokens(seq_id)} in all), "
            text += f"new blocks {list(new)}" if new else "no new block"
            moved = [(i, b, a) for i, (b, a) in enumerate(zip(before, after)) if a != b]
            for logical, old, new_id in moved:
                text += f"; copy-on-write: logical block {logical} moved from shared #{old} to #{new_id}"
            return text

        return self._run(act)

    def fork(self, seq_id: Optional[int], child_seq_id: Optional[int] = None) -> Optional[int]:
        """Fork ``seq_id`` into a new sequence sharing all its blocks; returns the child's id."""
        child = self._next_seq_id if child_seq_id is None else child_seq_id

        def act() -> str:
            self._need_seq(seq_id)
            fork = getattr(self.allocator, "fork", None)
            if fork is None:
                raise NotImplementedError(f"{type(self.allocator).__name__} has no fork() yet")
            fork(seq_id, child)
            self._next_seq_id = max(self._next_seq_id, child + 1)
            self._selected = child
            return f"forked seq {seq_id} -> seq {child}: shares blocks {self.allocator.get_block_mapping(child)}"

        return child if self._run(act) else None

    def free(self, seq_id: Optional[int]) -> bool:
        """Free a sequence; its blocks go back to the free queue (shared ones stay with the others).

        The log line says where each block went: back to the free queue (and whether it stays
        cached there), or still in use by the sequences that share it.
        """
        def act() -> str:
            self._need_seq(seq_id)
            if seq_id in getattr(self.allocator, "swapped_seq_ids", ()):
                self.allocator.free_sequence(seq_id)
                return f"freed seq {seq_id}, which was swapped out: its CPU blocks are free again"
            blocks = self.allocator.get_block_mapping(seq_id)
            self.allocator.free_sequence(seq_id)
            return f"freed seq {seq_id}: " + self._where_freed_blocks_went(blocks)

        return self._run(act)

    def _where_freed_blocks_went(self, blocks: Sequence[int]) -> str:
        """The end of a "freed seq N: ..." line: which of ``blocks`` are free now, which are not."""
        if not blocks:
            return "it held no block, so none went back to the free queue"
        free_now = set(self.allocator.free_blocks)
        released = [b for b in blocks if b in free_now]
        kept = [b for b in blocks if b not in free_now]
        holders = sorted({s for s, table in self.allocator.sequence_block_tables.items()
                          if not set(table.block_ids).isdisjoint(kept)})
        if not released:
            text = f"no block went back to the free queue: its {count(len(kept), 'block')} {kept}"
        else:
            text = f"blocks {released} back to the free queue"
            cached = [b.block_id for b in self.allocator.blocks
                      if b.block_id in released and b.block_hash is not None]
            if cached:
                text += f" ({cached} stay cached for a prompt with the same prefix)"
            if kept:
                text += f"; blocks {kept}"
        if kept:
            text += " stay in use" + (" by " + ", ".join(f"seq {s}" for s in holders) if holders else "")
        return text

    def swap_out(self, seq_id: Optional[int]) -> bool:
        """Move a sequence's K/V to the CPU pool, freeing its device blocks (preemption by swapping)."""
        def act() -> str:
            self._need_seq(seq_id)
            blocks = self.allocator.get_block_mapping(seq_id)
            if self.allocator.swap_out(seq_id) is None:  # refused, nothing changed
                raise OutOfBlocksError(len(blocks), len(self.allocator.free_cpu_blocks), f"swap out seq {seq_id}",
                                       pool="CPU")
            return f"swapped out seq {seq_id}: its {count(len(blocks), 'block')} now live in the CPU pool"

        return self._run(act)

    def swap_in(self, seq_id: Optional[int]) -> bool:
        """Bring a swapped-out sequence back onto (possibly different) device blocks."""
        def act() -> str:
            self._need_seq(seq_id)
            moved = self.allocator.swap_in(seq_id)
            if moved is None:  # refused, nothing changed
                raise OutOfBlocksError(len(self.allocator.swapped_block_tables[seq_id]), self.allocator.num_free_blocks,
                                       f"swap in seq {seq_id}")
            blocks = moved[1]
            return f"swapped in seq {seq_id} -> blocks {list(blocks)}"

        return self._run(act)

    def reset(self) -> None:
        """Start again: a fresh allocator like the first (or, for one you passed in, every sequence
        freed and the prefix cache emptied), an empty log, sequence ids from 0."""
        if self._factory is not None:
            self.allocator = self._factory()
            for view in (self.block_table, self.free_queue, self.translation):
                view.allocator = self.allocator
        else:
            for seq_id in self._all_seq_ids():
                self.allocator.free_sequence(seq_id)
            reset_cache = getattr(self.allocator, "reset_prefix_cache", None)
            if callable(reset_cache):
                reset_cache()
        self._entries.clear()
        self._next_seq_id = 0
        self._selected = None
        self.block_table.changed = set()
        self.refresh()

    # --------------------------------------------------------------- inspection
    @property
    def log(self) -> List[str]:
        """Every log line so far, oldest first; refused actions start with ``"error: "``."""
        return [("error: " + text) if kind == ERROR else text for kind, text in self._entries]

    def summary(self) -> str:
        """The allocator as text: pool, tables, shared blocks and free queue."""
        return f"{self.block_table.summary()}\n{self.free_queue.summary()}"

    def __repr__(self) -> str:
        return self.summary()

    def to_html(self) -> str:
        """A static picture of the current state (block tables and free queue) with the log."""
        return (f'<div class="pkv-playground-static">{self._log_html()}'
                f"{self.block_table.to_html()}{self.free_queue.to_html()}</div>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def _repr_mimebundle_(self, **kwargs: Any) -> Dict[str, Any]:
        # The live widget where a widget manager runs (JupyterLab), the static picture where
        # none does (GitHub, nbviewer), and the text summary everywhere else.
        bundle = widget_bundle(self.widget, **kwargs)
        bundle["text/html"] = self.to_html()
        bundle["text/plain"] = self.summary()
        return bundle

    def refresh(self) -> None:
        """Redraw everything from the allocator (call it after changing the allocator from code)."""
        swapped = set(getattr(self.allocator, "swapped_seq_ids", ()))
        options = [(f"seq {s} (swapped out)" if s in swapped else f"seq {s}", s) for s in self._all_seq_ids()]
        wanted = self._selected if self._selected is not None else self.seq_select.value
        self.seq_select.options = options
        ids = [s for _, s in options]
        self.seq_select.value = wanted if wanted in ids else (ids[-1] if ids else None)
        self._selected = None
        self.block_table.refresh()
        self.free_queue.refresh()
        if self.seq_select.value is not None and self.seq_select.value in ids:
            self.translation.seq_id = self.seq_select.value
        self.translation.refresh()
        self.log_html.value = self._log_html()

    # ---------------------------------------------------------------- internals
    def _add_from_controls(self) -> None:
        try:
            ids = parse_token_ids(self.token_ids.value)
            count = None if ids is not None else parse_count(self.prompt_tokens.value, "prompt tokens")
        except ValueError as exc:
            self._refuse(exc)
            return
        self.add_sequence(count, token_ids=ids)

    def _append_from_controls(self) -> None:
        try:
            count = parse_count(self.num_tokens.value, "tokens to append")
        except ValueError as exc:
            self._refuse(exc)
            return
        self.append(self.seq_select.value, count)

    def _refuse(self, exc: Exception) -> None:
        self._record(ERROR, f"{type(exc).__name__}: {exc}")
        self.block_table.changed = set()
        self.refresh()

    def _all_seq_ids(self) -> List[int]:
        """Resident sequences, then swapped-out ones (both can be picked in the dropdown)."""
        return list(self.allocator.seq_ids) + list(getattr(self.allocator, "swapped_seq_ids", ()))

    def _token_kwargs(self, method: Callable[..., Any], token_ids: Optional[Sequence[int]]) -> Dict[str, Any]:
        if token_ids is None:
            return {}
        if not _accepts_keyword(method, "token_ids"):
            raise NotImplementedError(f"{type(self.allocator).__name__}.{method.__name__} takes no token_ids yet")
        return {"token_ids": list(token_ids)}

    def _need_seq(self, seq_id: Optional[int]) -> None:
        if seq_id is None:
            raise ValueError("no sequence selected: add one first")

    def _run(self, act: Callable[[], str]) -> bool:
        """Do one action; log its line, or its error's message instead of a traceback; outline
        the blocks it changed (taken, freed, copied, evicted, filled)."""
        before = self._block_states()
        try:
            text = act()
        except Exception as exc:  # a UI boundary: every refusal becomes a readable line
            self._refuse(exc)
            return False
        after = self._block_states()
        self.block_table.changed = {b for b, state in after.items() if before.get(b) != state}
        self._record(OK, text)
        check = getattr(self.allocator, "check_invariants", None)
        if callable(check):
            try:
                check()
            except Exception as exc:
                self._record(ERROR, f"invariants broken after this action: {exc}")
        self.refresh()
        return True

    def _block_states(self) -> Dict[int, Tuple[Any, ...]]:
        return {b["block_id"]: (b["state"], tuple(sorted(b["owners"])), b["fill"], b["hash"])
                for b in snapshot.pool_blocks(self.allocator)}

    def _record(self, kind: str, text: str) -> None:
        self._entries.append((kind, text))

    def _log_html(self) -> str:
        shown = self._entries[-self.max_log_lines:] if self.max_log_lines > 0 else []
        if not shown:
            return f'<div class="pkv-log-empty" style="color:{MUTED_TEXT_SHORT}">log: nothing yet, try "add sequence"</div>'
        lines = []
        start = len(self._entries) - len(shown)
        for n, (kind, text) in enumerate(shown, start=start + 1):
            color = ERROR_TEXT if kind == ERROR else OK_TEXT
            mark = "\u2717" if kind == ERROR else "\u2713"
            lines.append(
                f'<div class="pkv-log-line pkv-{kind}" data-kind="{kind}" data-n="{n}" '
                f'style="font-family:monospace;font-size:12px;color:{color}">'
                f"{n:>3} {mark} {html.escape(text)}</div>"
            )
        return f'<div class="pkv-log-lines" style="line-height:1.35;margin:4px 0">{"".join(lines)}</div>'
