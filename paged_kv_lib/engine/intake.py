"""The engine's checks of what callers hand it: prompts, request options, the allocator and the model.

Each check raises a :class:`~paged_kv_lib.errors.PagedKVError` subclass naming the value and the
limit before anything changes; a request that could never fit is asked of the allocator
(``blocks_to_hold``), not worked out here.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import torch

from .._validate import as_count, as_iterable
from ..protocols import EngineAllocator
from ..errors import InvalidArgumentError, InvalidTypeError, PagedKVError
from ..model import TinyTransformer, check_temperature, encode
from .requests import RequestTooLargeError

Prompt = Union[str, Sequence[int]]
Prepared = Tuple[List[int], int, int, float, Optional[int]]  # prompt ids, max_new_tokens, n, temperature, seed
OPTIONS = ("n", "temperature", "seed")  # what generate() and stream() take besides prompts and max_new_tokens
T = TypeVar("T")


def typed(check: Callable[[Any], T], value: Any) -> T:
    """``check(value)``, a bare ``TypeError``/``ValueError`` it raises turned into the typed error (same message)."""
    try:
        return check(value)
    except PagedKVError:
        raise
    except TypeError as err:
        raise InvalidTypeError(str(err)) from err
    except ValueError as err:
        raise InvalidArgumentError(str(err)) from err


def check_parts(model: Any, allocator: Any) -> None:
    """Refuse a model that is not a ``TinyTransformer`` and an allocator that is not an ``EngineAllocator``."""
    if not isinstance(model, TinyTransformer):
        raise InvalidTypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
    if not isinstance(allocator, EngineAllocator):
        missing = [n for n in protocol_members() if not hasattr(allocator, n)]
        raise InvalidTypeError(
            f"allocator must implement EngineAllocator (paged_kv_lib.protocols); {type(allocator).__name__} lacks {missing}"
        )


def protocol_members() -> List[str]:
    """The names an :class:`EngineAllocator` has, sorted."""
    names: set = set()
    for proto in EngineAllocator.__mro__:
        if proto is not object and getattr(proto, "_is_protocol", False):
            names.update(n for n in vars(proto) if not n.startswith("_"))
    return sorted(names)


def check_options(options: Dict[str, Any], call: str) -> None:
    """Refuse options ``generate``/``stream`` do not take."""
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise InvalidTypeError(f"{call}() got unexpected options {sorted(unknown)}; it takes {', '.join(OPTIONS)}")


def prompt_ids(prompt: Any, vocab_size: int) -> List[int]:
    """A prompt as token ids: text is encoded (BOS + UTF-8 bytes), ids are checked against the vocabulary."""
    if isinstance(prompt, str):
        return typed(encode, prompt)
    if isinstance(prompt, (bytes, bytearray)):
        raise InvalidTypeError("prompt must be a str or a sequence of token ids, got bytes (decode it, or list() it)")
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.reshape(-1).tolist()
    ids = [as_count(t, "token id") for t in as_iterable(prompt, "prompt")]
    if not ids:
        raise InvalidArgumentError("the prompt must hold at least one token")
    for t in ids:
        if t >= vocab_size:
            raise InvalidArgumentError(f"token id {t} is outside the vocabulary [0, {vocab_size})")
    return ids


def prepare(prompt: Prompt, max_new_tokens: int, n: int, temperature: float, seed: Optional[int], *,
            vocab_size: int, max_batch_size: int, allocator: EngineAllocator, watermark: float) -> Prepared:
    """Check one request's arguments without changing anything; returns them normalised."""
    ids = prompt_ids(prompt, vocab_size)
    max_new_tokens = as_count(max_new_tokens, "max_new_tokens", minimum=1)
    n = as_count(n, "n", minimum=1)
    if n > max_batch_size:
        raise InvalidArgumentError(f"n={n} samples can never run together: max_batch_size is {max_batch_size}")
    temperature = typed(check_temperature, temperature)
    if seed is not None:
        seed = as_count(seed, "seed")
    # The last sampled token is never fed back: a sample holds at most prompt + max_new_tokens - 1 tokens.
    longest = len(ids) + max_new_tokens - 1
    needed = allocator.blocks_to_hold(longest, num_seqs=n, watermark=watermark)
    if needed > allocator.num_blocks:
        raise RequestTooLargeError(
            f"request can never fit: {n} sample(s) of up to {len(ids)} + {max_new_tokens} - 1 tokens need "
            f"{needed} blocks of {allocator.block_size} (watermark included), but the pool has only "
            f"{allocator.num_blocks}",
            needed,
            allocator.num_blocks,
        )
    return ids, max_new_tokens, n, temperature, seed
