"""Choosing the next token: greedy or one reproducible draw per position."""

from __future__ import annotations

import math
from typing import Optional

import torch

from .._validate import as_count
from ..errors import InvalidArgumentError, InvalidTypeError


def sample_generator(seed: int, sample_index: int = 0) -> torch.Generator:
    """The random stream of sample ``sample_index`` of a request seeded with ``seed``.

    One stream per sample, drawn from once per generated position, makes sampling
    independent of batch composition and of preemption.
    """
    seed = as_count(seed, "seed")
    sample_index = as_count(sample_index, "sample_index")
    return torch.Generator().manual_seed((seed * 1_000_003 + sample_index) % (2**63))


def sample_token(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> int:
    """Pick the next token from ``logits`` ``[vocab]``: argmax at temperature 0, else one draw.

    A draw uses exactly one uniform number from ``generator`` (inverse CDF), so replaying
    the same stream gives the same tokens. ``temperature`` is assumed checked
    (:func:`check_temperature`).
    """
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    cdf = probs.cumsum(0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), logits.shape[0] - 1)


def check_temperature(temperature: float) -> float:
    """A finite temperature >= 0 as a float (0 means greedy)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise InvalidTypeError(f"temperature must be a float, got {type(temperature).__name__} {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise InvalidArgumentError(f"temperature must be finite and >= 0, got {temperature!r}")
    return float(temperature)
