"""The paged forward: new tokens' K/V written through the slot mapping, read back by paged attention."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .._validate import as_iterable
from ..protocols import PagedKVView
from ..kv_cache import write_rows, write_slots
from ..errors import InvalidArgumentError, InvalidTypeError
from .batch import DecodeAttention, PagedBatch
from .decoder import Decoder
from .tokens import TokenIds, check_vocab


def check_allocator(model: Decoder, allocator: PagedKVView) -> None:
    """Raise unless ``allocator`` is a :class:`PagedKVView` whose cache has ``model``'s K/V shape."""
    cfg = model.config
    want = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device)
    try:  # duck-typed: an isinstance check against the protocol would evaluate every property
        caches = allocator.k_caches
    except AttributeError as err:
        raise InvalidTypeError(f"the allocator must be a PagedKVView, got {type(allocator).__name__}") from err
    first = caches[0] if caches else None  # [num_blocks, num_kv_heads, block_size, head_dim], one per layer
    have = None if first is None else (len(caches), first.shape[1], first.shape[3], first.dtype, first.device)
    if want != have:
        raise InvalidArgumentError(
            "the allocator's cache does not fit this model: need (num_layers, num_kv_heads, "
            f"head_dim, dtype, device) = {want}, got {have}"
            + ("" if caches else " (allocate_cache=False)")
        )


def _chunk_list(chunk: TokenIds, index: int) -> list:
    if isinstance(chunk, torch.Tensor):
        if chunk.dtype.is_floating_point or chunk.dtype.is_complex or chunk.dtype == torch.bool:
            raise InvalidTypeError(f"chunks[{index}] must hold integer token ids, got a {chunk.dtype} tensor")
        return chunk.reshape(-1).tolist()
    if isinstance(chunk, (str, bytes)):
        raise InvalidTypeError(f"chunks[{index}] must hold token ids, got a {type(chunk).__name__}")
    ids = list(as_iterable(chunk, f"chunks[{index}]"))
    for t in ids:
        if type(t) is not int and (isinstance(t, bool) or not hasattr(t, "__index__")):
            raise InvalidTypeError(f"chunks[{index}] must hold int token ids, got {type(t).__name__} {t!r}")
    return ids


def forward_paged(
    model: Decoder,
    allocator: PagedKVView,
    seq_ids: Sequence[int],
    chunks: Sequence[TokenIds],
    *,
    write: Optional[Sequence[bool]] = None,
    decode_attention: Optional[DecodeAttention] = None,
) -> torch.Tensor:
    """Run the newest tokens of several sequences with a paged cache; logits of each chunk's last token.

    ``chunks[i]`` holds the *last* ``len(chunks[i])`` tokens of sequence ``seq_ids[i]``,
    which the allocator must already count (the engine allocated or appended them).
    Their K/V goes to the slots the allocator maps them to (unless ``write[i]`` is
    False: the prefix cache already holds it); those slots are the sequence's own,
    since growing a sequence copies a shared last block first (copy-on-write inside
    ``append_tokens``). Then each token attends causally to its sequence.

    The whole batch is handled at once: one block-table tensor, one slot mapping, one
    K/V write and one attention call per layer, rotary and norms on the packed tokens.
    Attention is decode attention when every chunk is one token, else extend
    attention; ``decode_attention`` (:data:`~paged_kv_lib.model.batch.DecodeAttention`), when given,
    computes decode attention instead of the library's kernel. Returns ``[len(seq_ids), vocab]``.
    Bad input raises before anything is written.
    """
    check_allocator(model, allocator)
    seq_ids = list(as_iterable(seq_ids, "seq_ids"))
    chunks = list(as_iterable(chunks, "chunks"))
    if len(chunks) != len(seq_ids) or not seq_ids:
        raise InvalidArgumentError(
            f"need one non-empty chunk per sequence (at least one): {len(seq_ids)} ids, {len(chunks)} chunks"
        )
    if write is None:
        write_list = [True] * len(seq_ids)
    else:
        write_list = list(as_iterable(write, "write"))
        for w in write_list:
            if not isinstance(w, bool):
                raise InvalidTypeError(f"write must hold bools, got {type(w).__name__} {w!r}")
        if len(write_list) != len(seq_ids):
            raise InvalidArgumentError(f"write has {len(write_list)} entries for {len(seq_ids)} sequences")
    # The engine's chunks are lists of ints: taken as they are; anything else is checked and converted.
    id_lists = [c if type(c) is list and all(type(t) is int for t in c) else _chunk_list(c, i)
                for i, c in enumerate(chunks)]
    q_lens = [len(ids) for ids in id_lists]
    lens = [allocator.get_num_tokens(s) for s in seq_ids]
    for seq_id, n, seq_len in zip(seq_ids, q_lens, lens):
        if not 1 <= n <= seq_len:
            raise InvalidArgumentError(
                f"sequence {seq_id} holds {seq_len} tokens; a chunk of {n} cannot be its newest (1 to {seq_len})"
            )
    flat = [t for ids in id_lists for t in ids]
    check_vocab(flat, model.config.vocab_size)  # on the list: no tensor reductions per step
    tokens = torch.tensor(flat, dtype=torch.int64, device=model.device)
    batch = PagedBatch.build(allocator, seq_ids, lens, q_lens, write_list, model.config.num_kv_heads, decode_attention)
    k_caches, v_caches = allocator.k_caches, allocator.v_caches
    contiguous = all(c.is_contiguous() for c in (*k_caches, *v_caches))

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = k_caches[layer], v_caches[layer]
        if batch.write_rows is not None:
            k, v = k[batch.write_rows], v[batch.write_rows]
        if contiguous:
            write_rows(k_cache, v_cache, batch.cache_rows, k, v)
        else:
            write_slots(k_cache, v_cache, batch.slots, k, v)
        return batch.attention(q, k_cache, v_cache)

    hidden = model.run(tokens, batch.positions, attend)
    return model.lm_head(hidden if batch.decode else hidden[batch.last_rows])
