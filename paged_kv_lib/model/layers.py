"""The parts of a layer: RMSNorm, rotary positions, and the decoder layer's weights.

The modules only hold parameters (their names are the checkpoint's and map onto
transformers' Llama); the arithmetic is plain functions the forward calls on stacked weights.
"""

from __future__ import annotations

import functools
from typing import Tuple

import torch
from torch import nn
from torch.nn import functional as F

from .config import ModelConfig


class RMSNorm(nn.Module):
    """The learned gain of an RMSNorm (applied by :func:`rms_norm`)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` scaled to unit root-mean-square over its last axis, times ``weight`` (torch's fused RMSNorm)."""
    return F.rms_norm(x, weight.shape, weight, eps)


def rotary_tables(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` ``[n, 1, head_dim]`` of the angles ``pos * freq`` of each position, in ``dtype``.

    Channel ``i`` and its partner ``i + d/2`` share an angle, so each half repeats the
    other. They depend only on the positions, so a forward computes them once for every
    layer. Each token turns by its own position only, so its result does not depend on
    which other tokens share the batch (what makes the three forwards agree).
    """
    angles = positions.to(torch.float32)[:, None] * _rotary_freqs(head_dim, theta, positions.device)[None, :]
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


@functools.lru_cache(maxsize=16)
def _rotary_freqs(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """The per-channel-pair frequencies ``theta ** (-i / (d/2))``, computed once per shape."""
    half = head_dim // 2
    return theta ** (-torch.arange(half, device=device, dtype=torch.float32) / half)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn pairs of channels ``(i, i + d/2)`` of ``x`` ``[n, heads, d]`` by the tabled angles.

    ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``, written as ``x cos + (-x2, x1) sin``
    so each product is one elementwise op over the whole width (the same roundings).
    """
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class DecoderLayer(nn.Module):
    """Pre-norm attention and SwiGLU MLP, each added back to the residual stream."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w_gate = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w_down = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
