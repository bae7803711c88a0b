"""The reference generator: one request, token by token, with no paging (what the engine must match)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

import torch

from .._validate import as_count
from ..errors import InvalidArgumentError
from .contiguous import ContiguousKVCache
from .sampling import check_temperature, sample_generator, sample_token
from .tokens import TokenIds, token_ids_list

if TYPE_CHECKING:
    from .transformer import TinyTransformer


@torch.no_grad()
def generate_reference(
    model: "TinyTransformer",
    prompt_ids: TokenIds,
    max_new_tokens: int,
    *,
    cached: bool,
    temperature: float = 0.0,
    seed: int = 0,
    sample_index: int = 0,
) -> List[int]:
    """The new token ids of one request: rerunning the whole sequence each step, or with
    ``cached`` a contiguous K/V cache reserved for prompt + ``max_new_tokens`` that each step
    extends by the newest token. Both sample from the same seeded stream, so they agree."""
    ids = token_ids_list(prompt_ids, model.config.vocab_size, "prompt_ids")
    if not ids:
        raise InvalidArgumentError("the prompt must hold at least one token, got 0")
    max_new_tokens = as_count(max_new_tokens, "max_new_tokens")
    temperature = check_temperature(temperature)
    gen = sample_generator(seed, sample_index)
    cache = ContiguousKVCache(model, 1, len(ids) + max_new_tokens) if cached else None
    out: List[int] = []
    for _ in range(max_new_tokens):
        if cache is None:
            logits = model(ids + out)[0, -1]
        else:
            step: List[int] = out[-1:] if out else ids
            logits = model.forward_contiguous([step], cache)[0, -1]
        out.append(sample_token(logits, temperature, gen))
    return out


def generate_no_cache(
    model: "TinyTransformer",
    prompt_ids: TokenIds,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    sample_index: int = 0,
) -> List[int]:
    """Generate by rerunning the whole sequence each step; returns the new token ids."""
    return generate_reference(model, prompt_ids, max_new_tokens, cached=False, temperature=temperature,
                              seed=seed, sample_index=sample_index)


def generate_contiguous(
    model: "TinyTransformer",
    prompt_ids: TokenIds,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    sample_index: int = 0,
) -> List[int]:
    """Generate with a contiguous K/V cache reserved for prompt + max_new_tokens; returns the new ids."""
    return generate_reference(model, prompt_ids, max_new_tokens, cached=True, temperature=temperature,
                              seed=seed, sample_index=sample_index)
