"""Attention on contiguous K/V (the no-cache and contiguous-cache forwards)."""

from __future__ import annotations

import math

import torch


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention on contiguous tensors: ``q`` ``[b, n_q, hq, d]``, ``k``/``v`` ``[b, n_k, hkv, d]``.

    ``mask`` ``[b, n_q, n_k]`` says which keys each query sees. Scores and softmax in
    float32, as in the paged reference. Returns ``[b, n_q, hq, d]``.
    """
    group = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2).float()  # [b, hq, n_q, d]
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1).float()
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1).float()
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2).to(q.dtype)
