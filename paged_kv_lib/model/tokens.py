"""Byte-level tokens: a token is a UTF-8 byte, plus one beginning-of-text id."""

from __future__ import annotations

import operator
from typing import Iterable, List, Sequence, Union

import torch

from ..errors import InvalidArgumentError, InvalidTypeError

NUM_BYTES = 256
BOS_ID = 256  # beginning of text; the only id that is not a byte
VOCAB_SIZE = NUM_BYTES + 1

TokenIds = Union[Sequence[int], torch.Tensor]
TokenBatch = Union[TokenIds, Sequence[Sequence[int]]]  # one sequence, or one row per sequence


def encode(text: str, *, bos: bool = True) -> List[int]:
    """UTF-8 bytes of ``text`` as token ids, after ``BOS_ID`` unless ``bos=False``."""
    if not isinstance(text, str):
        raise InvalidTypeError(f"text must be a str, got {type(text).__name__} {text!r}")
    return ([BOS_ID] if bos else []) + list(text.encode("utf-8"))


def decode(token_ids: TokenIds) -> str:
    """Token ids back to text; BOS is dropped and broken UTF-8 shows as U+FFFD.

    An id outside the vocabulary ``[0, VOCAB_SIZE)`` is refused, not skipped: it cannot
    have come from this tokenizer or the model.
    """
    ids = token_ids_list(token_ids, VOCAB_SIZE, "token_ids")
    return bytes(i for i in ids if i < NUM_BYTES).decode("utf-8", errors="replace")


def token_ids_list(token_ids: TokenIds, vocab_size: int, name: str = "token ids") -> List[int]:
    """``token_ids`` (ints, or an int tensor) as a list of ints, every id in ``[0, vocab_size)``."""
    if isinstance(token_ids, torch.Tensor):
        if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex or token_ids.dtype == torch.bool:
            raise InvalidTypeError(f"{name} must be integers, got a {token_ids.dtype} tensor")
        ids = token_ids.reshape(-1).tolist()
    elif isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Iterable):
        raise InvalidTypeError(f"{name} must be a sequence of ints, got {type(token_ids).__name__} {token_ids!r}")
    else:
        ids = list(token_ids)
        for i in ids:
            if isinstance(i, bool) or not hasattr(i, "__index__"):
                raise InvalidTypeError(f"{name} must be ints, got {type(i).__name__} {i!r}")
        ids = [operator.index(i) for i in ids]
    check_vocab(ids, vocab_size)
    return ids


def check_vocab(ids: List[int], vocab_size: int) -> None:
    """Raise ``InvalidArgumentError`` naming the first id outside ``[0, vocab_size)`` (min/max only: cheap)."""
    if not ids:
        return
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InvalidArgumentError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
