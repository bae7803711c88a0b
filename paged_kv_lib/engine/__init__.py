"""A continuous-batching inference engine driving the paged KV cache.

Each :meth:`Engine.step` is one iteration of the serving loop:

1. **Decode**: every running sequence gets one slot for its newest token (the allocator
   adds a block or copies a shared one when needed). If the pool is short, the newest
   running request is preempted, by recompute (free its blocks, requeue it at the front)
   or by swap (move its K/V to the CPU pool). Then one forward pass over the whole batch,
   one ``paged_attention`` call per layer, and one token sampled per sequence.
2. **Admit**: waiting requests join first come, first served while the pool keeps a
   watermark of free blocks. A new prompt's cached prefix is reused and only its tail is
   computed (one ``paged_attention_extend`` call per layer for all admitted prompts);
   ``n > 1`` samples then share the prompt through ``fork``.

Requests can be added between steps: they join the running batch at the next one
(iteration-level scheduling). Sampling draws once per generated position from a
per-sample generator, so seeded results do not depend on the batch or on preemption.
"""

from .loop import PREEMPTION_MODES, Engine, Prompt
from .requests import Request, RequestOutput, RequestTooLargeError, Sample, Status, UnsupportedModelError
from .stats import EngineTotals, StepStats

__all__ = [
    "PREEMPTION_MODES",
    "Engine",
    "EngineTotals",
    "Prompt",
    "Request",
    "RequestOutput",
    "RequestTooLargeError",
    "Sample",
    "Status",
    "StepStats",
    "UnsupportedModelError",
]
