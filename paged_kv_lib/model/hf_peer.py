"""The tiny model as a Hugging Face ``LlamaForCausalLM``: a peer to check and time the engine against.

``TinyTransformer`` is a Llama in every detail that matters (RMSNorm, rotary positions on
rotated halves, grouped-query attention, SwiGLU MLP, untied head), so its weights map one
to one onto transformers' Llama. Built locally from a config and a state dict: nothing is
downloaded. ``transformers`` is optional (``pip install 'paged-kv[peer]'``).
"""

from __future__ import annotations

from typing import Any, Dict

import torch

from .tokens import BOS_ID
from .transformer import TinyTransformer

PEER_HINT = "the Hugging Face peer needs transformers: pip install 'paged-kv[peer]'"

# Our parameter names inside a layer -> LlamaDecoderLayer's.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "wq.weight": "self_attn.q_proj.weight",
    "wk.weight": "self_attn.k_proj.weight",
    "wv.weight": "self_attn.v_proj.weight",
    "wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "w_gate.weight": "mlp.gate_proj.weight",
    "w_up.weight": "mlp.up_proj.weight",
    "w_down.weight": "mlp.down_proj.weight",
}


def hf_state_dict(model: TinyTransformer) -> Dict[str, torch.Tensor]:
    """The model's weights under ``LlamaForCausalLM``'s names (tensors shared, not copied)."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            out[f"model.layers.{index}.{_LAYER_NAMES[rest]}"] = tensor
        elif name == "embed.weight":
            out["model.embed_tokens.weight"] = tensor
        elif name == "norm.weight":
            out["model.norm.weight"] = tensor
        elif name == "lm_head.weight":
            out["lm_head.weight"] = tensor
        else:  # a new parameter this mapping does not know: fail loudly, never skip it
            raise KeyError(f"no LlamaForCausalLM name for parameter {name!r}")
    return out


def to_hf_llama(model: TinyTransformer, *, max_positions: int = 4096) -> Any:
    """A ``LlamaForCausalLM`` in eval mode computing what ``model`` computes (fp32, same device).

    ``eos_token_id`` is unset, so ``generate`` always produces ``max_new_tokens``, as the
    engine does; byte 0 pads left-padded batches (the attention mask hides it).
    """
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(PEER_HINT) from err
    cfg = model.config
    config = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=max_positions,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,  # transformers 5 moves it into rope_parameters itself
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=BOS_ID,
        eos_token_id=None,
        pad_token_id=0,
    )
    peer = LlamaForCausalLM(config).to(dtype=model.dtype, device=model.device)  # type: ignore[call-arg]
    missing, unexpected = peer.load_state_dict(hf_state_dict(model), strict=False)
    # Only rotary buffers (computed, not learned) may be absent from our state dict.
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise RuntimeError(f"weights did not map one to one: missing {missing}, unexpected {unexpected}")
    return peer.eval()
