"""The tiny model is a Llama: mapped onto transformers' LlamaForCausalLM it gives the same logits and tokens."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from paged_kv_lib.engine import Engine  # noqa: E402
from paged_kv_lib.model import ModelConfig, TinyTransformer, encode, generate_no_cache, load_tiny_model  # noqa: E402
from paged_kv_lib.model.hf_peer import hf_state_dict, to_hf_llama  # noqa: E402


PROMPTS = [
    encode("The allocator hands out blocks"),
    encode("A block table maps logical blocks to physical ones, and"),
    encode("x"),
]


@pytest.fixture(scope="module")
def tiny():
    model = load_tiny_model()
    return model, to_hf_llama(model)


@torch.no_grad()
def test_logits_agree_within_1e_4(tiny) -> None:
    model, peer = tiny
    for ids in PROMPTS:
        ours = model(ids)[0]
        theirs = peer(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)


@torch.no_grad()
def test_left_padded_batch_agrees(tiny) -> None:
    """The padded batch HF generate runs: each row's real tokens give that prompt's logits."""
    model, peer = tiny
    width = max(len(p) for p in PROMPTS)
    ids = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(PROMPTS):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    logits = peer(ids, attention_mask=mask).logits
    for row, p in enumerate(PROMPTS):
        torch.testing.assert_close(logits[row, width - len(p):], model(p)[0], rtol=0, atol=1e-4)


@torch.no_grad()
def test_greedy_tokens_are_identical_to_hf_generate(tiny) -> None:
    model, peer = tiny
    engine = Engine(model, model.new_allocator(64, 16), max_batch_size=8)
    outputs = engine.generate(PROMPTS, 24)
    for ids, out in zip(PROMPTS, outputs):
        mask = torch.ones(1, len(ids), dtype=torch.long)
        theirs = peer.generate(torch.tensor([ids]), attention_mask=mask, max_new_tokens=24, do_sample=False)
        theirs = theirs[0, len(ids):].tolist()
        assert len(theirs) == 24
        assert list(out.token_ids) == theirs == generate_no_cache(model, ids, 24)


@torch.no_grad()
def test_a_different_shape_maps_too() -> None:
    """Other sizes and a non-default rotary base: the mapping reads the config, not constants."""
    cfg = ModelConfig(dim=96, num_layers=3, num_heads=6, num_kv_heads=2, hidden_dim=120, rope_theta=500.0)
    model = TinyTransformer(cfg, seed=5).eval()
    peer = to_hf_llama(model)
    ids = PROMPTS[1]
    torch.testing.assert_close(peer(torch.tensor([ids])).logits[0], model(ids)[0], rtol=0, atol=1e-4)


def test_every_parameter_is_mapped_once() -> None:
    model = TinyTransformer(ModelConfig(), seed=0)
    mapped = hf_state_dict(model)
    assert len(mapped) == len(model.state_dict()) == len(set(mapped))
    peer = to_hf_llama(model)
    for name, tensor in mapped.items():
        assert torch.equal(peer.state_dict()[name], tensor), name


def test_an_unknown_parameter_is_refused() -> None:
    model = TinyTransformer(ModelConfig(), seed=0)
    model.register_buffer("extra", torch.zeros(1))
    with pytest.raises(KeyError, match="extra"):
        hf_state_dict(model)
