"""Input checks for the paged attention entry points; each failure raises a typed error.

Shape, dtype and device checks are free (they read tensor metadata). Value checks (block
ids in range, lengths that fit the table) read tensor contents, which on a GPU means a
device sync, so the caller decides whether to run them.
"""

from __future__ import annotations

import math
from typing import Optional

import torch


from ..errors import InvalidArgumentError, InvalidTypeError

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 256
BACKENDS = ("auto", "torch", "triton")


def _tensor(value: object, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _int_tensor(value: object, name: str, dims: int) -> torch.Tensor:
    t = _tensor(value, name)
    if t.dtype not in (torch.int32, torch.int64):
        raise InvalidTypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != dims:
        raise InvalidArgumentError(f"{name} must have {dims} dimension(s), got shape {tuple(t.shape)}")
    return t


def check_backend(backend: object) -> str:
    """Return ``backend`` if it is one of ``BACKENDS``."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise InvalidArgumentError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def check_scale(scale: object, head_dim: int) -> float:
    """The softmax scale: ``1/sqrt(head_dim)`` when ``None``, else a positive finite float."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise InvalidTypeError(f"scale must be a float or None, got {type(scale).__name__} {scale!r}")
    if not math.isfinite(scale) or scale <= 0:
        raise InvalidArgumentError(f"scale must be positive and finite, got {scale!r}")
    return float(scale)


def check_num_splits(num_splits: object) -> Optional[int]:
    """``None`` (choose automatically) or a power of two from 1 to 256."""
    if num_splits is None:
        return None
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise InvalidTypeError(f"num_splits must be an int or None, got {type(num_splits).__name__}")
    if num_splits < 1 or num_splits > 256 or num_splits & (num_splits - 1):
        raise InvalidArgumentError(f"num_splits must be a power of two from 1 to 256, got {num_splits}")
    return num_splits


def check_common(
    q: object,
    k_cache: object,
    v_cache: object,
    block_tables: object,
    seq_lens: object,
    num_rows: Optional[int] = None,
) -> None:
    """Check the shapes, dtypes and devices shared by decode and extend attention.

    ``num_rows`` is the number of sequences when ``q`` does not tell it (extend form).
    """
    q = _tensor(q, "q")
    k_cache = _tensor(k_cache, "k_cache")
    v_cache = _tensor(v_cache, "v_cache")
    block_tables = _int_tensor(block_tables, "block_tables", 2)
    seq_lens = _int_tensor(seq_lens, "seq_lens", 1)

    if q.dim() != 3:
        raise InvalidArgumentError(f"q must be 3-D [tokens, num_q_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4:
        raise InvalidArgumentError(
            "k_cache must be 4-D [num_blocks, num_kv_heads, block_size, head_dim], "
            f"got shape {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise InvalidArgumentError(f"v_cache shape {tuple(v_cache.shape)} differs from k_cache shape {tuple(k_cache.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise InvalidTypeError(f"q dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise InvalidTypeError(f"{name} dtype {t.dtype} differs from q dtype {q.dtype}")

    num_blocks, num_kv_heads, block_size, head_dim = k_cache.shape
    if q.shape[2] != head_dim:
        raise InvalidArgumentError(f"q head_dim {q.shape[2]} differs from the cache head_dim {head_dim}")
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise InvalidArgumentError(f"head_dim must be from {MIN_HEAD_DIM} to {MAX_HEAD_DIM}, got {head_dim}")
    if num_blocks < 1 or num_kv_heads < 1 or block_size < 1:
        raise InvalidArgumentError(f"the caches must not be empty, got shape {tuple(k_cache.shape)}")
    if q.shape[1] % num_kv_heads:
        raise InvalidArgumentError(
            f"num_q_heads ({q.shape[1]}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )

    num_seqs = q.shape[0] if num_rows is None else num_rows
    if seq_lens.shape[0] != num_seqs:
        raise InvalidArgumentError(f"seq_lens has {seq_lens.shape[0]} entries, expected {num_seqs} (one per sequence)")
    if block_tables.shape[0] != num_seqs:
        raise InvalidArgumentError(f"block_tables has {block_tables.shape[0]} rows, expected {num_seqs} (one per sequence)")

    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.device != q.device:
            raise InvalidArgumentError(f"{name} is on {t.device}, but q is on {q.device}")


def check_values(block_tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, block_size: int) -> None:
    """Check every length fits its table row and every block id it uses is a real block."""
    max_tokens = block_tables.shape[1] * block_size
    lens = seq_lens.long()
    if bool((lens < 0).any()):
        bad = int(torch.nonzero(lens < 0)[0, 0])
        raise InvalidArgumentError(f"seq_lens[{bad}] = {int(lens[bad])} is negative")
    if bool((lens > max_tokens).any()):
        bad = int(torch.nonzero(lens > max_tokens)[0, 0])
        raise InvalidArgumentError(
            f"seq_lens[{bad}] = {int(lens[bad])} exceeds what a block table row of "
            f"{block_tables.shape[1]} blocks of {block_size} holds ({max_tokens})"
        )
    columns = torch.arange(block_tables.shape[1], device=block_tables.device)
    used = columns[None, :] * block_size < lens[:, None]  # a column is used if its first slot holds a token
    out_of_range = (block_tables < 0) | (block_tables >= num_blocks)
    bad_entries = used & out_of_range
    if bool(bad_entries.any()):
        row, col = (int(x) for x in torch.nonzero(bad_entries)[0])
        raise InvalidArgumentError(
            f"block_tables[{row}, {col}] = {int(block_tables[row, col])} is not a block id in "
            f"[0, {num_blocks}), yet sequence {row} ({int(lens[row])} tokens) uses it"
        )


def check_query_start_loc(query_start_loc: object, num_seqs: int) -> torch.Tensor:
    """Check the shape and dtype of ``query_start_loc`` (its values: ``check_extend_values``)."""
    t = _int_tensor(query_start_loc, "query_start_loc", 1)
    if t.shape[0] != num_seqs + 1:
        raise InvalidArgumentError(
            f"query_start_loc has {t.shape[0]} entries, expected num_seqs + 1 = {num_seqs + 1}"
        )
    return t


def check_extend_values(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, total_q: int) -> None:
    """Check ``query_start_loc`` runs from 0 to ``total_q`` without going back, and every
    sequence has at least as many tokens as new queries."""
    starts = query_start_loc.long()
    if int(starts[0]) != 0 or int(starts[-1]) != total_q:
        raise InvalidArgumentError(
            f"query_start_loc must start at 0 and end at q.shape[0] = {total_q}, "
            f"got {int(starts[0])} ... {int(starts[-1])}"
        )
    q_lens = starts[1:] - starts[:-1]
    if bool((q_lens < 0).any()):
        bad = int(torch.nonzero(q_lens < 0)[0, 0])
        raise InvalidArgumentError(f"query_start_loc decreases at index {bad + 1}")
    too_many = q_lens > seq_lens.long()
    if bool(too_many.any()):
        bad = int(torch.nonzero(too_many)[0, 0])
        raise InvalidArgumentError(
            f"sequence {bad} has {int(q_lens[bad])} new query tokens but seq_lens[{bad}] = "
            f"{int(seq_lens[bad])}; seq_lens must count the new tokens too"
        )
