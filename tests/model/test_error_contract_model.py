"""The error contract for the model: tokenizer, sampling, the forwards and the reference generator.

Every bad input raises a PagedKVError that is also the built-in a caller expects, with the
value (and the limit) in the message, and the allocator or cache it was given is unchanged.
"""

from __future__ import annotations

import math

import pytest
import torch

from paged_kv_lib import PagedKVCacheAllocator
from paged_kv_lib.errors import InvalidArgumentError, InvalidTypeError, PagedKVError, UnknownSequenceError
from paged_kv_lib.model import (
    VOCAB_SIZE,
    ContiguousKVCache,
    ModelConfig,
    TinyTransformer,
    check_temperature,
    decode,
    encode,
    generate_contiguous,
    generate_no_cache,
    sample_generator,
)

from helpers import assert_same_state, snapshot



@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=3).eval()


def raises(builtin, *words):
    """A context that expects a typed error, subclass of ``builtin``, whose message holds ``words``."""

    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(PagedKVError)
            self.info = self.ctx.__enter__()
            return self

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            err = self.info.value
            assert isinstance(err, builtin), f"{type(err).__name__} is not a {builtin.__name__}"
            if builtin is TypeError:
                assert isinstance(err, InvalidTypeError)
            elif builtin is ValueError:
                assert isinstance(err, (InvalidArgumentError, UnknownSequenceError))
            for word in words:
                assert word in str(err), f"{word!r} missing from: {err}"
            return handled

    return Check()


# ------------------------------------------------------------------ tokens
@pytest.mark.parametrize("text", [123, b"bytes", None, ["a"]])
def test_encode_refuses_what_is_not_text(text) -> None:
    with raises(TypeError, "str", type(text).__name__):
        encode(text)


@pytest.mark.parametrize("ids, bad", [([10**6], "1000000"), ([65, -1], "-1"), ([VOCAB_SIZE], str(VOCAB_SIZE))])
def test_decode_refuses_ids_past_the_vocabulary(ids, bad) -> None:
    with raises(ValueError, bad, f"[0, {VOCAB_SIZE})"):
        decode(ids)
    with raises(ValueError, bad):
        decode(torch.tensor(ids))


@pytest.mark.parametrize("ids", ["abc", [1.5], [True], torch.tensor([1.0])])
def test_decode_refuses_what_is_not_token_ids(ids) -> None:
    with raises(TypeError):
        decode(ids)


def test_decode_keeps_accepting_every_id_of_the_vocabulary() -> None:
    assert decode(encode("paged")) == "paged"
    assert decode(torch.tensor(encode("kv"))) == "kv"


# ------------------------------------------------------------------ sampling and config
@pytest.mark.parametrize("value, builtin", [(-0.5, ValueError), (math.inf, ValueError), (math.nan, ValueError),
                                            ("hot", TypeError), (True, TypeError), (None, TypeError)])
def test_temperature(value, builtin) -> None:
    with raises(builtin, "temperature", repr(value)):
        check_temperature(value)


@pytest.mark.parametrize("seed, builtin", [(-1, ValueError), (1.0, TypeError), (True, TypeError)])
def test_sample_generator_seed(seed, builtin) -> None:
    with raises(builtin, "seed"):
        sample_generator(seed)


@pytest.mark.parametrize("changes, words", [(dict(dim=66), ["66", "num_heads"]), (dict(num_kv_heads=3), ["3"]),
                                            (dict(vocab_size=10), ["10", str(VOCAB_SIZE)]),
                                            (dict(rope_theta=0.0), ["0.0"]), (dict(num_layers=0), ["num_layers"])])
def test_model_config(changes, words) -> None:
    with raises(ValueError, *words):
        ModelConfig(**changes)


# ------------------------------------------------------------------ no-cache forward and reference
@pytest.mark.parametrize("ids, builtin, words", [
    ([1, VOCAB_SIZE], ValueError, [str(VOCAB_SIZE), "vocabulary"]),
    ([-3], ValueError, ["-3"]),
    (torch.tensor([1.0, 2.0]), TypeError, ["float32"]),
    ("text", TypeError, ["str"]),
    ([[]], ValueError, ["(1, 0)"]),
])
def test_forward_refuses_bad_tokens(model, ids, builtin, words) -> None:
    with raises(builtin, *words):
        model(ids)


@pytest.mark.parametrize("generate", [generate_no_cache, generate_contiguous])
@pytest.mark.parametrize("args, options, builtin, words", [
    (([], 3), {}, ValueError, ["at least one token"]),
    (([1, 2], -1), {}, ValueError, ["max_new_tokens", "-1"]),
    (([1, 2], 2.0), {}, TypeError, ["max_new_tokens"]),
    (([1, 10**6], 2), {}, ValueError, ["1000000"]),
    (("hi", 2), {}, TypeError, ["prompt_ids", "str"]),
    (([1, 2], 2), dict(temperature=-1.0), ValueError, ["temperature", "-1.0"]),
    (([1, 2], 2), dict(seed=-2), ValueError, ["seed", "-2"]),
])
def test_reference_generators(model, generate, args, options, builtin, words) -> None:
    with raises(builtin, *words):
        generate(model, *args, **options)


# ------------------------------------------------------------------ contiguous forward
@pytest.mark.parametrize("call, builtin, words", [
    (lambda m, c: m.forward_contiguous([[1] * 6], c), ValueError, ["max_len=8", "9"]),
    (lambda m, c: m.forward_contiguous([[1], [2]], c, rows=[0]), ValueError, ["1 entries", "2"]),
    (lambda m, c: m.forward_contiguous([[1]], c, rows=[5]), ValueError, ["row 5", "2 rows"]),
    (lambda m, c: m.forward_contiguous([[1]], c, rows=[-1]), ValueError, ["row", "-1"]),
    (lambda m, c: m.forward_contiguous([[VOCAB_SIZE]], c), ValueError, [str(VOCAB_SIZE)]),
    (lambda m, c: c.reset_row(2), ValueError, ["row 2"]),
])
def test_contiguous_forward(model, call, builtin, words) -> None:
    cache = ContiguousKVCache(model, 2, 8)
    model.forward_contiguous([[1, 2, 3]], cache)
    before = (cache.k.clone(), cache.v.clone(), cache.lengths.clone())
    with raises(builtin, *words):
        call(model, cache)
    for a, b in zip(before, (cache.k, cache.v, cache.lengths)):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ paged forward
@torch.no_grad()
def prepared(model) -> PagedKVCacheAllocator:
    alloc = model.new_allocator(8, 4)
    alloc.allocate_for_sequence(0, 3)
    alloc.allocate_for_sequence(1, 5)
    model.forward_paged(alloc, [0, 1], [[1, 2, 3], [4, 5, 6, 7, 8]])
    return alloc


PAGED = {
    "unknown sequence": (lambda m, a: m.forward_paged(a, [9], [[1]]), UnknownSequenceError, ["9"]),
    "no sequences": (lambda m, a: m.forward_paged(a, [], []), ValueError, ["0 ids", "0 chunks"]),
    "chunks per sequence": (lambda m, a: m.forward_paged(a, [0, 1], [[1]]), ValueError, ["2 ids", "1 chunks"]),
    "chunk longer than the sequence": (lambda m, a: m.forward_paged(a, [0], [[1] * 4]), ValueError,
                                       ["holds 3 tokens", "chunk of 4", "1 to 3"]),
    "empty chunk": (lambda m, a: m.forward_paged(a, [0], [[]]), ValueError, ["chunk of 0"]),
    "token past the vocabulary": (lambda m, a: m.forward_paged(a, [0, 1], [[1], [VOCAB_SIZE + 5]]), ValueError,
                                  [str(VOCAB_SIZE + 5), f"[0, {VOCAB_SIZE})"]),
    "negative token": (lambda m, a: m.forward_paged(a, [0], [[-1]]), ValueError, ["-1"]),
    "float token": (lambda m, a: m.forward_paged(a, [0], [[1.0]]), TypeError, ["float"]),
    "float tensor chunk": (lambda m, a: m.forward_paged(a, [0], [torch.tensor([1.0])]), TypeError, ["float32"]),
    "text chunk": (lambda m, a: m.forward_paged(a, [0], ["a"]), TypeError, ["str"]),
    "write count": (lambda m, a: m.forward_paged(a, [0, 1], [[1], [2]], write=[True]), ValueError,
                    ["1 entries", "2 sequences"]),
    "write not bools": (lambda m, a: m.forward_paged(a, [0], [[1]], write=[1]), TypeError, ["bools", "int"]),
    "seq_ids not iterable": (lambda m, a: m.forward_paged(a, 0, [[1]]), TypeError, ["seq_ids"]),
}


@pytest.mark.parametrize("name", sorted(PAGED))
def test_paged_forward_refuses_bad_input_and_writes_nothing(model, name) -> None:
    call, builtin, words = PAGED[name]
    alloc = prepared(model)
    before = snapshot(alloc)
    with raises(builtin, *words), torch.no_grad():
        call(model, alloc)
    assert_same_state(before, snapshot(alloc))


def test_paged_forward_refuses_an_allocator_that_does_not_fit(model) -> None:
    cfg = model.config
    other = PagedKVCacheAllocator(8, 4, cfg.num_kv_heads + 1, cfg.head_dim, model.dtype, num_layers=cfg.num_layers)
    other.allocate_for_sequence(0, 2)
    before = snapshot(other)
    with raises(ValueError, "num_kv_heads", str(cfg.num_kv_heads + 1)):
        model.forward_paged(other, [0], [[1, 2]])
    assert_same_state(before, snapshot(other))
    with raises(ValueError, "allocate_cache=False"):
        model.check_allocator(model.new_allocator(8, 4, allocate_cache=False))
    with raises(TypeError, "PagedKVView", "object"):
        model.forward_paged(object(), [0], [[1]])


def test_paged_forward_still_takes_tensors_and_tuples(model) -> None:
    alloc = model.new_allocator(8, 4)
    alloc.allocate_for_sequence(0, 3)
    with torch.no_grad():
        out = model.forward_paged(alloc, (0,), (torch.tensor([1, 2, 3]),), write=(True,))
    assert out.shape == (1, model.config.vocab_size)
