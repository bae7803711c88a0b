"""The tiny transformer: its three forwards agree, its inputs are checked, sampling is seeded."""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib.model import (
    BOS_ID,
    ContiguousKVCache,
    ModelConfig,
    TinyTransformer,
    check_temperature,
    decode,
    encode,
    generate_contiguous,
    generate_no_cache,
    load_checkpoint,
    sample_generator,
    sample_token,
    save_checkpoint,
)

PROMPT = encode("pages of keys and values")





@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=3).eval()


def test_encode_decode_round_trip() -> None:
    text = "bloc de clés ✓"
    ids = encode(text)
    assert ids[0] == BOS_ID and len(ids) == 1 + len(text.encode("utf-8"))
    assert decode(ids) == text
    assert encode(text, bos=False) == ids[1:]
    assert decode([0xE2]) == "\ufffd"  # a cut multi-byte character does not raise


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=60, num_heads=8), "multiple of num_heads"),
        (dict(num_heads=4, num_kv_heads=3), "multiple of num_kv_heads"),
        (dict(dim=12, num_heads=4), "even"),
        (dict(num_layers=0), "num_layers"),
        (dict(vocab_size=100), "vocab_size"),
    ],
)
def test_config_rejects_bad_sizes(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kwargs)


def test_weights_come_from_the_seed() -> None:
    a, b, c = TinyTransformer(seed=1), TinyTransformer(seed=1), TinyTransformer(seed=2)
    assert torch.equal(a.layers[0].wq.weight, b.layers[0].wq.weight)
    assert not torch.equal(a.layers[0].wq.weight, c.layers[0].wq.weight)


def test_forward_is_causal(model) -> None:
    with torch.no_grad():
        full = model(PROMPT)[0]
        changed = model(PROMPT[:-1] + [(PROMPT[-1] + 1) % 256])[0]
    assert torch.allclose(full[:-1], changed[:-1], atol=1e-5)
    assert not torch.allclose(full[-1], changed[-1], atol=1e-3)


def test_forward_rejects_bad_tokens(model) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model([1, 2, 999])
    with pytest.raises(ValueError, match="seq >= 1"):
        model(torch.zeros(1, 0, dtype=torch.int64))


def test_contiguous_cache_logits_match_no_cache(model) -> None:
    cache = ContiguousKVCache(model, 2, 40)
    other = encode("another prompt, longer than the first one")[:20]
    with torch.no_grad():
        ref = model(PROMPT)[0]
        got_a = model.forward_contiguous([PROMPT[:7]], cache, rows=[1])[0]
        got_b = model.forward_contiguous([other[:5]], cache, rows=[0])[0]
        more = model.forward_contiguous([[PROMPT[7]], [other[5]]], cache, rows=[1, 0])
    assert torch.allclose(got_a, ref[:7], atol=1e-4)
    assert torch.allclose(got_b, model(other[:5])[0], atol=1e-4)
    assert torch.allclose(more[0, 0], ref[7], atol=1e-4)
    assert torch.allclose(more[1, 0], model(other[:6])[0, 5], atol=1e-4)
    assert cache.lengths.tolist() == [6, 8]
    with pytest.raises(ValueError, match="max_len=40"):
        model.forward_contiguous([list(range(40))], cache, rows=[1])


def test_contiguous_generation_equals_no_cache(model) -> None:
    assert generate_contiguous(model, PROMPT, 24) == generate_no_cache(model, PROMPT, 24)
    sampled = dict(temperature=0.9, seed=11)
    assert generate_contiguous(model, PROMPT, 16, **sampled) == generate_no_cache(model, PROMPT, 16, **sampled)


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_forward_matches_no_cache(model, block_size) -> None:
    """Prefill in two chunks, then decode token by token; every logit row matches the reference."""
    alloc = model.new_allocator(64, block_size)
    seq = encode("paged attention reads keys through the block table")
    with torch.no_grad():
        ref = model(seq)[0]
        alloc.allocate_for_sequence(5, 9)
        first = model.forward_paged(alloc, [5], [seq[:9]])
        alloc.append_tokens(5, 6)
        second = model.forward_paged(alloc, [5], [seq[9:15]])
        assert torch.allclose(first[0], ref[8], atol=1e-4)
        assert torch.allclose(second[0], ref[14], atol=1e-4)
        for pos in range(15, len(seq)):
            alloc.append_tokens(5, 1)
            step = model.forward_paged(alloc, [5], [seq[pos : pos + 1]])
            assert torch.allclose(step[0], ref[pos], atol=1e-4), pos


def test_paged_forward_batches_sequences_of_different_lengths(model) -> None:
    alloc = model.new_allocator(32, 4)
    a, b = encode("short"), encode("a rather longer prompt")
    with torch.no_grad():
        alloc.allocate_for_sequence(0, len(a))
        alloc.allocate_for_sequence(1, len(b))
        got = model.forward_paged(alloc, [0, 1], [a, b])
        assert torch.allclose(got[0], model(a)[0, -1], atol=1e-4)
        assert torch.allclose(got[1], model(b)[0, -1], atol=1e-4)
        # One decode step for both at once (the engine's batch).
        alloc.append_tokens(0, 1)
        alloc.append_tokens(1, 1)
        got = model.forward_paged(alloc, [0, 1], [[65], [66]])
        assert torch.allclose(got[0], model(a + [65])[0, -1], atol=1e-4)
        assert torch.allclose(got[1], model(b + [66])[0, -1], atol=1e-4)


def test_paged_forward_without_write_reads_the_cached_kv(model) -> None:
    """A chunk marked write=False is computed from the K/V already in the cache."""
    alloc = model.new_allocator(16, 4)
    with torch.no_grad():
        alloc.allocate_for_sequence(0, len(PROMPT))
        model.forward_paged(alloc, [0], [PROMPT])
        before = [c.clone() for c in alloc.k_caches]
        again = model.forward_paged(alloc, [0], [PROMPT[-1:]], write=[False])
        assert all(torch.equal(x, y) for x, y in zip(before, alloc.k_caches))
        assert torch.allclose(again[0], model(PROMPT)[0, -1], atol=1e-4)


def test_paged_forward_checks_its_inputs(model) -> None:
    alloc = model.new_allocator(16, 4)
    alloc.allocate_for_sequence(0, 3)
    with pytest.raises(ValueError, match="cannot be its newest"):
        model.forward_paged(alloc, [0], [[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="one non-empty chunk per sequence"):
        model.forward_paged(alloc, [0], [])
    wrong = TinyTransformer(ModelConfig(num_kv_heads=4)).new_allocator(16, 4)
    with pytest.raises(ValueError, match="does not fit this model"):
        model.forward_paged(wrong, [0], [[1]])


@pytest.mark.parametrize("num_kv_heads", [1, 4])
def test_grouped_query_variants_agree(num_kv_heads) -> None:
    model = TinyTransformer(ModelConfig(num_heads=4, num_kv_heads=num_kv_heads), seed=5).eval()
    alloc = model.new_allocator(16, 2)
    alloc.allocate_for_sequence(0, len(PROMPT))
    with torch.no_grad():
        got = model.forward_paged(alloc, [0], [PROMPT])
        assert torch.allclose(got[0], model(PROMPT)[0, -1], atol=1e-4)


def test_sample_token_greedy_and_seeded() -> None:
    logits = torch.tensor([0.1, 2.0, 1.9, -3.0])
    assert sample_token(logits, 0.0, None) == 1
    draws = lambda seed: [sample_token(logits, 1.0, g) for g in [sample_generator(seed)] for _ in range(50)]  # noqa: E731
    assert draws(4) == draws(4)
    assert draws(4) != draws(5)
    assert set(draws(4)) <= {0, 1, 2, 3} and len(set(draws(4))) >= 2
    peaked = torch.tensor([0.0, 50.0, 0.0, 0.0])
    gen = sample_generator(0)
    assert all(sample_token(peaked, 1.0, gen) == 1 for _ in range(20))
    assert sample_generator(3, 0).initial_seed() != sample_generator(3, 1).initial_seed()


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    gen = sample_generator(9)
    counts = torch.bincount(torch.tensor([sample_token(logits, 1.0, gen) for _ in range(3000)]), minlength=3)
    assert torch.allclose(counts / 3000, torch.tensor([0.7, 0.2, 0.1]), atol=0.04)


def test_temperature_is_checked() -> None:
    with pytest.raises(ValueError, match="temperature"):
        check_temperature(-0.5)
    with pytest.raises(ValueError, match="temperature"):
        check_temperature(float("nan"))
    with pytest.raises(TypeError, match="temperature"):
        check_temperature("hot")


def test_checkpoint_round_trip(tmp_path, model) -> None:
    path = tmp_path / "m.pt"
    save_checkpoint(model, str(path))
    loaded = load_checkpoint(str(path))
    assert loaded.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a.half().float(), b), name


def test_shipped_model_writes_words_of_its_corpus() -> None:
    """The checkpoint loads, is small, and continues a prompt with real words, not noise."""
    from importlib import resources

    from paged_kv_lib.model import CHECKPOINT, load_tiny_model

    data = resources.files("paged_kv_lib") / "data"
    with resources.as_file(data / CHECKPOINT) as path:
        assert path.stat().st_size < 2_000_000
    model = load_tiny_model()
    vocabulary = set((data / "tiny_corpus.txt").read_text(encoding="utf-8").split())
    text = decode(generate_contiguous(model, encode("The allocator"), 120))
    words = text.split()[1:-1]  # the first may continue the prompt's word, the last is cut off
    assert len(words) >= 10
    known = sum(w in vocabulary for w in words)
    assert known >= 0.8 * len(words), text


def test_stacked_projections_follow_the_weights() -> None:
    """The q/k/v and gate/up matmuls run on stacked weights: a change to a weight is seen at
    once, and training still reaches every parameter."""
    model = TinyTransformer(ModelConfig(), seed=4).eval()
    with torch.no_grad():
        before = model(PROMPT)
        model.layers[0].wk.weight.mul_(0.5)
        after = model(PROMPT)
    assert not torch.allclose(before, after)
    fresh = TinyTransformer(ModelConfig(), seed=4).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh(PROMPT), after)
    with torch.no_grad():
        model.layers[1].w_up.weight = torch.nn.Parameter(model.layers[1].w_up.weight * 2)  # a new object
        assert not torch.allclose(model(PROMPT), after)
    model.train()
    model(PROMPT).sum().backward()
    for name in ("wq", "wk", "wv", "w_gate", "w_up"):
        grad = getattr(model.layers[1], name).weight.grad
        assert grad is not None and grad.abs().sum() > 0, name
