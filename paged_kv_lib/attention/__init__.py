"""Paged attention: attention that reads K/V through a block table instead of a contiguous cache.

``paged_attention`` serves decoding (one query token per sequence) and
``paged_attention_extend`` serves prefill and chunked prefill (several new tokens per
sequence, causal). Both run on batched torch (``batched.py``: the whole batch in one
gather and one masked matmul) or on Triton kernels; Triton is optional and imported only
when its backend is used. ``reference.py`` is the readable per-sequence version, kept for
the lessons and as the oracle both are tested against.
"""

from .api import (
    MIN_TRITON_CAPABILITY,
    TRITON_HINT,
    auto_backend,
    check_supported,
    paged_attention,
    paged_attention_extend,
    preferred_dtype,
    resolve_backend,
    triton_available,
)
from .batched import paged_attention_batched, paged_attention_extend_batched
from .reference import gather_kv, paged_attention_extend_reference, paged_attention_reference

__all__ = [
    "MIN_TRITON_CAPABILITY",
    "TRITON_HINT",
    "auto_backend",
    "check_supported",
    "gather_kv",
    "paged_attention",
    "paged_attention_batched",
    "paged_attention_extend",
    "paged_attention_extend_batched",
    "paged_attention_extend_reference",
    "paged_attention_reference",
    "preferred_dtype",
    "resolve_backend",
    "triton_available",
]
