"""Saving and loading a :class:`TinyTransformer`, and the small model the library ships."""

from __future__ import annotations

from dataclasses import asdict
from importlib import resources

import torch

from .config import ModelConfig
from .transformer import TinyTransformer

CHECKPOINT = "tiny_model.pt"


def save_checkpoint(model: TinyTransformer, path: str) -> None:
    """Save the config and an fp16 copy of the weights (half the bytes; plenty for a demo)."""
    state = {k: v.detach().to(torch.float16).cpu() for k, v in model.state_dict().items()}
    torch.save({"config": asdict(model.config), "state_dict": state}, path)


def load_checkpoint(path_or_file) -> TinyTransformer:
    """Load a checkpoint written by :func:`save_checkpoint` as a float32 CPU model in eval mode."""
    blob = torch.load(path_or_file, map_location="cpu", weights_only=True)
    model = TinyTransformer(ModelConfig(**blob["config"]))
    model.load_state_dict({k: v.float() for k, v in blob["state_dict"].items()})
    return model.eval()


def load_tiny_model() -> TinyTransformer:
    """The small byte-level model shipped with the library, trained by ``scripts/train_tiny_model.py``."""
    ref = resources.files("paged_kv_lib") / "data" / CHECKPOINT
    if not ref.is_file():
        raise FileNotFoundError(
            f"{CHECKPOINT} is missing from paged_kv_lib/data; run scripts/train_tiny_model.py to make it"
        )
    with ref.open("rb") as handle:
        return load_checkpoint(handle)
