"""A continuous-batching inference engine driving the paged KV cache.

Each :meth:`Engine.step` is one iteration of the serving loop, under a budget of
``max_num_batched_tokens`` computed tokens (as vLLM v1 schedules):

1. **Decodes first**: running sequences that finished their prompt get one slot each for
   their newest token, oldest first, as far as the budget goes, all in one
   ``allocate_slots`` call, which grows them all or says they do not fit (changing nothing);
   while they do not, the newest running request is preempted, by recompute (free its
   blocks, requeue it at the front) or by swap (move its K/V to the CPU pool).
2. **Then prompt chunks**: a running sequence mid-prompt grows by its next chunk, as much
   as the budget left and the allocator allow (``allocate_prompt`` places as much as fits).
3. **Admit**: waiting requests join first come, first served while the allocator says
   their first chunk fits and leaves the watermark free (``allocate_prompt``, one call that
   checks and acts; a swapped request by one ``swap_in`` of all its samples, or none). A prompt's cached prefix is reused, not computed;
   ``n > 1`` samples share the prompt through ``fork`` once it is all in.

Then one forward pass carries the decodes and the chunks together (one block-table
tensor, one slot mapping, one K/V write and one paged attention call per layer), and a
token is sampled for each decode and each prompt that ended. :meth:`Engine.stream`
yields those tokens as they come; :meth:`Engine.abort_request` drops a request at once.

Requests can be added between steps: they join the running batch at the next one
(iteration-level scheduling). Sampling draws once per generated position from a
per-sample generator, so seeded results do not depend on the batch or on preemption.
A step that fails puts the running requests back in the queue with their blocks
released, so the engine stays usable; a model paged attention cannot serve is refused
when the engine is built.

The allocator is any :class:`~paged_kv_lib.protocols.EngineAllocator`: one call per step grows the
decodes (``allocate_slots``: the blocks placed, or ``None`` and the newest request is preempted), one
call admits a prompt or places its next chunk (``allocate_prompt``); ``swap_out`` and ``swap_in`` move a
request's samples all or none (``None``: they do not fit); ``blocks_to_hold`` refuses a request that could
never fit, ``can_allocate_many`` comes before samples re-admitted together. The engine reads nothing else.
Modules: ``loop`` (:class:`Engine`, the requests and the step loop), ``scheduler`` (the queues
and every scheduling decision), ``forward`` (one forward and its sampling), ``intake`` (the
typed checks of what callers pass), ``requests``, ``stats``, ``cli``.
"""

from .intake import Prompt
from .loop import Engine
from .scheduler import PREEMPTION_MODES, Scheduler
from .requests import Request, RequestOutput, RequestTooLargeError, Sample, Status, TokenEvent
from .requests import UnknownRequestError, UnsupportedModelError
from .stats import EngineTotals, StepStats

__all__ = [
    "PREEMPTION_MODES",
    "Engine",
    "EngineTotals",
    "Prompt",
    "Request",
    "RequestOutput",
    "RequestTooLargeError",
    "Scheduler",
    "Sample",
    "Status",
    "StepStats",
    "TokenEvent",
    "UnknownRequestError",
    "UnsupportedModelError",
]
