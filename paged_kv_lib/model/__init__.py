"""The tiny byte-level transformer the course runs, one job per module.

``tokens`` (encode/decode), ``config``, ``layers`` and ``transformer`` (the model and its
no-cache forward), ``contiguous`` (the worst-case cache and its forward), ``batch`` and
``paged`` (the paged forward), ``dense`` (attention on contiguous K/V), ``sampling``,
``reference`` (the one-request generator the engine is checked against), ``checkpoint``,
and ``hf_peer`` (the same model as transformers' Llama; imports transformers on use).
Every name lessons, exercises and the engine import is re-exported here.
"""

from .batch import PagedBatch
from .checkpoint import CHECKPOINT, load_checkpoint, load_tiny_model, save_checkpoint
from .config import ModelConfig
from .contiguous import ContiguousKVCache
from .dense import dense_attention
from .layers import DecoderLayer, RMSNorm, apply_rotary, rms_norm, rotary_tables
from .reference import generate_contiguous, generate_no_cache, generate_reference
from .sampling import check_temperature, sample_generator, sample_token
from .tokens import BOS_ID, NUM_BYTES, VOCAB_SIZE, TokenIds, decode, encode
from .transformer import AttendFn, TinyTransformer

__all__ = [
    "AttendFn",
    "BOS_ID",
    "CHECKPOINT",
    "ContiguousKVCache",
    "DecoderLayer",
    "ModelConfig",
    "NUM_BYTES",
    "PagedBatch",
    "RMSNorm",
    "TinyTransformer",
    "TokenIds",
    "VOCAB_SIZE",
    "apply_rotary",
    "check_temperature",
    "decode",
    "dense_attention",
    "encode",
    "generate_contiguous",
    "generate_no_cache",
    "generate_reference",
    "load_checkpoint",
    "load_tiny_model",
    "rms_norm",
    "rotary_tables",
    "sample_generator",
    "sample_token",
    "save_checkpoint",
]
