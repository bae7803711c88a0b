"""A continuous-batching inference engine driving the paged KV cache.

Each :meth:`Engine.step` is one iteration of the serving loop:

1. **Decode**: every running sequence gets one slot for its newest token (the allocator
   adds a block or copies a shared one when needed). The scheduler asks the allocator
   whether the whole batch can grow (``can_append``); while it cannot, the newest running
   request is preempted, by recompute (free its blocks, requeue it at the front) or by
   swap (move its K/V to the CPU pool). Then one forward pass over the whole batch (one
   block-table tensor, one slot mapping, one K/V write and one paged attention call per
   layer) and one token sampled per sequence.
2. **Admit**: waiting requests join first come, first served while the allocator says
   they fit and leave the watermark free (``can_allocate``, ``can_swap_in``). A new
   prompt's cached prefix is reused and only its tail is computed (one extend attention
   call per layer for all admitted prompts); ``n > 1`` samples then share the prompt
   through ``fork``.

Requests can be added between steps: they join the running batch at the next one
(iteration-level scheduling). Sampling draws once per generated position from a
per-sample generator, so seeded results do not depend on the batch or on preemption.
A step that fails puts the running requests back in the queue with their blocks
released, so the engine stays usable; a model paged attention cannot serve is refused
when the engine is built.
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
