"""One step's forward and sampling: the scheduled decodes and prompt chunks through the model, a token each.

The scheduler has already grown every sequence in the allocator by the tokens it carries;
:func:`run_forward` puts them through ``model.forward_paged`` in one call, samples the next
token of each decode and of each prompt that ends this step (forking a new request's other
samples from its prompt first), and hands every token to ``emit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

from ..protocols import EngineAllocator
from ..model import TinyTransformer, sample_token
from ..model.batch import DecodeAttention
from .requests import Request, Sample

Decode = Tuple[Request, Sample]
Emit = Callable[[Request, Sample, int], None]


@dataclass(eq=False)
class Chunk:
    """A run of one sample's prompt scheduled this step: its tokens (already allocated), whether their K/V is
    written (not when the cache held the whole prompt), whether it ends the prompt, and the tokens found cached."""

    request: Request
    sample: Sample
    tokens: List[int]
    write: bool
    completes: bool
    cached: int


def run_forward(model: TinyTransformer, allocator: EngineAllocator, decodes: List[Decode], chunks: List[Chunk],
                emit: Emit, decode_attention: Optional[DecodeAttention] = None) -> int:
    """Run these decodes and prompt chunks in one forward, sample, ``emit`` each token; returns how many.
    ``decode_attention``, when given, serves the steps that are decodes only (see ``PagedBatch``)."""
    if not decodes and not chunks:
        return 0
    seq_ids = [s.seq_id for _, s in decodes] + [c.sample.seq_id for c in chunks]
    inputs = [s.output[-1:] for _, s in decodes] + [c.tokens for c in chunks]
    write = None if all(c.write for c in chunks) else [True] * len(decodes) + [c.write for c in chunks]
    logits = model.forward_paged(allocator, seq_ids, inputs, write=write, decode_attention=decode_attention)
    greedy = logits.argmax(dim=-1).tolist()  # one transfer for every greedy row
    generated = 0
    for row, (request, sample) in enumerate(decodes):
        token = greedy[row] if request.temperature == 0 else _sample(request, sample, logits[row])
        emit(request, sample, token)
        generated += 1
    for row, chunk in enumerate(chunks, start=len(decodes)):
        if not chunk.completes:
            continue
        request, sample = chunk.request, chunk.sample
        sample.reset_prefill()
        if request.started:
            emit(request, sample, _sample(request, sample, logits[row]))
            generated += 1
            continue
        for child in request.samples[1:]:  # a new prompt: its other samples share it from here on
            allocator.fork(sample.seq_id, child.seq_id)
        for each in request.samples:  # each draws its first token from its own generator
            emit(request, each, _sample(request, each, logits[row]))
            generated += 1
    return generated


def _sample(request: Request, sample: Sample, logits: torch.Tensor) -> int:
    return sample_token(logits, request.temperature, sample.generator)
