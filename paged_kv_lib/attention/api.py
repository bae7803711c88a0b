"""The public entry points: check the inputs, then run the torch or Triton backend."""

from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Optional, Tuple

import torch

from ..errors import InvalidArgumentError, InvalidTypeError

from . import _checks
from .batched import paged_attention_batched, paged_attention_extend_batched

TRITON_HINT = "the triton backend needs Triton: pip install 'paged-kv[triton]'"


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether Triton can be imported (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def _triton_module():
    """Import the kernels on first use, so the library works without Triton installed."""
    if not triton_available():
        raise ImportError(TRITON_HINT)
    from . import triton_kernel

    return triton_kernel


# The kernels are tuned and tested for Ampere (sm_80) and newer: on a T4 (sm_75) decode spills
# registers, and there is no bf16. Below this, "auto" runs the torch backend.
MIN_TRITON_CAPABILITY = (8, 0)
_told: set = set()


def cuda_capability(device: torch.device) -> Tuple[int, int]:
    """The CUDA compute capability of ``device`` (a CUDA device), as ``(major, minor)``."""
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def auto_backend(device: torch.device) -> Tuple[str, Optional[str]]:
    """What ``"auto"`` runs on ``device``, and why not Triton when a CUDA device gets torch."""
    if device.type != "cuda":
        return "torch", None
    if not triton_available():
        return "torch", TRITON_HINT
    capability = cuda_capability(device)
    if capability < MIN_TRITON_CAPABILITY:
        want = "sm_{}{}".format(*MIN_TRITON_CAPABILITY)
        return "torch", (f"this GPU is sm_{capability[0]}{capability[1]}; the Triton kernels need {want} or newer, "
                         "so attention runs on the torch backend")
    return "triton", None


def resolve_backend(backend: str, device: torch.device) -> str:
    """``"auto"`` means Triton for CUDA tensors on compute capability 8.0+ when Triton is
    installed, torch otherwise; on a CUDA GPU that gets torch, one line (once) says why."""
    backend = _checks.check_backend(backend)
    if backend == "auto":
        backend, why = auto_backend(device)
        if why is not None and why not in _told:
            _told.add(why)
            print(f"paged_kv_lib.attention: {why}", file=sys.stderr)
    return backend


def preferred_dtype(device: torch.device) -> torch.dtype:
    """The half precision to run attention in on ``device``: bf16 where the GPU has it, fp16 on
    older GPUs (a T4 has no bf16), fp32 on a CPU (where half precision is slow and no faster)."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16


def _should_check_values(check_values: Optional[bool], device: torch.device) -> bool:
    if check_values is None:
        return device.type == "cpu"
    if not isinstance(check_values, bool):
        raise InvalidTypeError(f"check_values must be a bool or None, got {type(check_values).__name__}")
    return check_values


def check_supported(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
    """Raise the error ``paged_attention`` would raise for these head counts, head size and dtype.

    A caller (the engine, when it is built) asks this instead of restating the limits: the
    same checks run on empty stand-in tensors, so nothing is computed or allocated.
    """
    q = torch.empty((0, num_q_heads, head_dim), dtype=dtype, device="meta")
    cache = torch.empty((1, num_kv_heads, 1, head_dim), dtype=dtype, device="meta")
    table = torch.empty((0, 1), dtype=torch.int32, device="meta")
    lens = torch.empty((0,), dtype=torch.int32, device="meta")
    _checks.check_common(q, cache, cache, table, lens)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    backend: str = "auto",
    num_splits: Optional[int] = None,
    check_values: Optional[bool] = None,
) -> torch.Tensor:
    """Decode attention over a paged KV cache: one new query token per sequence.

    Args:
        q: ``[num_seqs, num_q_heads, head_dim]``, fp32/fp16/bf16.
        k_cache, v_cache: ``[num_blocks, num_kv_heads, block_size, head_dim]``, q's dtype;
            ``num_q_heads`` must be a multiple of ``num_kv_heads`` (grouped-query attention).
        block_tables: int32/int64 ``[num_seqs, max_blocks]``, physical block ids in logical
            order; entries past a sequence's last block are never read (pad them with -1).
        seq_lens: int32/int64 ``[num_seqs]``, tokens cached per sequence. A sequence of
            length 0 gets an all-zero output row.
        scale: softmax scale, ``1/sqrt(head_dim)`` by default.
        backend: ``"torch"`` (batched torch, ``batched.py``), ``"triton"`` (the kernel; CPU tensors need
            ``TRITON_INTERPRET=1``) or ``"auto"`` (Triton for CUDA tensors on compute capability
            8.0+ if installed; see ``auto_backend``).
        num_splits: Triton only: cut each sequence into this many chunks (a power of
            two; split-K). ``None`` chooses by ``choose_num_splits``. Torch ignores it.
        check_values: also check every used block id and length (reads the tensors: a
            device sync on GPU). ``None`` checks on CPU only. Unchecked, the kernel still
            never reads outside the cache: bad block ids are masked out.

    Returns:
        ``[num_seqs, num_q_heads, head_dim]`` in q's dtype.
    """
    _checks.check_common(q, k_cache, v_cache, block_tables, seq_lens)
    scale = _checks.check_scale(scale, q.shape[-1])
    num_splits = _checks.check_num_splits(num_splits)
    backend = resolve_backend(backend, q.device)
    if _should_check_values(check_values, q.device):
        _checks.check_values(block_tables, seq_lens, k_cache.shape[0], k_cache.shape[2])

    if backend == "torch":
        return paged_attention_batched(q, k_cache, v_cache, block_tables, seq_lens, scale)
    return _triton_module().paged_attention_triton(
        q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=num_splits
    )


def paged_attention_extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    scale: Optional[float] = None,
    backend: str = "auto",
    max_query_len: Optional[int] = None,
    check_values: Optional[bool] = None,
) -> torch.Tensor:
    """Prefill/extend attention: several new tokens per sequence, attending causally.

    The new tokens of all sequences are packed into ``q`` ``[total_q, num_q_heads,
    head_dim]``; sequence ``i`` owns rows ``query_start_loc[i]:query_start_loc[i+1]``
    (``query_start_loc`` is int ``[num_seqs + 1]``, cumulative, starting at 0). Their
    K/V must already be written to the cache, and ``seq_lens[i]`` counts them: new token
    ``j`` of ``n`` sits at position ``seq_lens[i] - n + j`` and attends to every position
    up to its own. A prompt's prefill is the case ``n == seq_lens[i]``.

    ``max_query_len`` (the largest ``n``) sizes the Triton grid; pass it to avoid a
    device sync. Other arguments as in ``paged_attention``. Returns q's shape and dtype.
    """
    if not isinstance(q, torch.Tensor):
        raise InvalidTypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if not isinstance(seq_lens, torch.Tensor):
        raise InvalidTypeError(f"seq_lens must be a torch.Tensor, got {type(seq_lens).__name__}")
    num_seqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    _checks.check_common(q, k_cache, v_cache, block_tables, seq_lens, num_rows=num_seqs)
    query_start_loc = _checks.check_query_start_loc(query_start_loc, num_seqs)
    if query_start_loc.device != q.device:
        raise InvalidArgumentError(f"query_start_loc is on {query_start_loc.device}, but q is on {q.device}")
    if max_query_len is not None and (isinstance(max_query_len, bool) or not isinstance(max_query_len, int)):
        raise InvalidTypeError(f"max_query_len must be an int or None, got {type(max_query_len).__name__}")
    scale = _checks.check_scale(scale, q.shape[-1])
    backend = resolve_backend(backend, q.device)
    if _should_check_values(check_values, q.device):
        _checks.check_values(block_tables, seq_lens, k_cache.shape[0], k_cache.shape[2])
        _checks.check_extend_values(query_start_loc, seq_lens, q.shape[0])
        if max_query_len is not None:
            actual = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if num_seqs else 0
            if max_query_len < actual:
                raise InvalidArgumentError(f"max_query_len={max_query_len} is less than the longest query ({actual})")

    if backend == "torch":
        return paged_attention_extend_batched(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale
        )
    return _triton_module().paged_attention_extend_triton(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
        max_query_len=max_query_len,
    )
