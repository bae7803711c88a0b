"""A tiny decoder-only transformer whose attention can keep its K/V in the paged cache.

The architecture is the one of today's open models, shrunk: byte-level tokens, RMSNorm,
rotary positions, grouped-query attention and a gated (SwiGLU) MLP. One layer body
(:meth:`TinyTransformer.run`) is shared by three forwards, which differ only in where K/V lives:

* :meth:`TinyTransformer.forward` recomputes the whole sequence (no cache): the reference.
* :meth:`TinyTransformer.forward_contiguous` keeps K/V in a ``ContiguousKVCache``
  (``contiguous.py``), one worst-case slab per sequence: what engines did before paging.
* :meth:`TinyTransformer.forward_paged` (``paged.py``) writes K/V through the slot mapping
  and reads it with paged attention: what the engine runs.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, cast

import torch
from torch import nn
from torch.nn import functional as F

from .._validate import as_count
from ..allocator import PagedKVCacheAllocator
from ..protocols import PagedKVView
from ..errors import InvalidArgumentError, InvalidTypeError
from . import contiguous, paged
from .batch import DecodeAttention
from .config import ModelConfig
from .decoder import AttendFn
from .dense import dense_attention
from .layers import DecoderLayer, RMSNorm, apply_rotary, rms_norm, rotary_tables
from .tokens import TokenBatch, TokenIds, check_vocab



class TinyTransformer(nn.Module):
    """A decoder-only transformer over bytes, with weights drawn from ``seed``.

    All forwards take *packed* tokens (a flat list over every sequence) and their
    positions; what changes between them is only how a layer's attention finds its K/V.
    """

    def __init__(self, config: Optional[ModelConfig] = None, *, seed: int = 0) -> None:
        super().__init__()
        self.config = cfg = config if config is not None else ModelConfig()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._init_weights(as_count(seed, "seed"))
        self._weights_cache: Optional[tuple] = None

    def _init_weights(self, seed: int) -> None:
        # Unit-variance activations make even an untrained model's logits decisive, so
        # greedy choices are not near-ties that rounding could flip between paths.
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("norm.weight"):
                    continue
                fan_in = 1 if name == "embed.weight" else param.shape[1]
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(fan_in))

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    # ------------------------------------------------------------ shared body
    def run(self, tokens: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """Hidden states ``[n, dim]`` of packed ``tokens`` ``[n]`` at ``positions`` ``[n]``.

        ``attend(layer, q, k, v)`` is the only thing a forward supplies: where K/V goes and
        what each query sees.
        """
        cfg = self.config
        n, eps, d = tokens.shape[0], cfg.norm_eps, cfg.head_dim
        hq, hkv = cfg.num_heads, cfg.num_kv_heads
        cos, sin = rotary_tables(positions, d, cfg.rope_theta, self.dtype)
        embed, layers, final_norm = self._weights()
        x = F.embedding(tokens, embed)
        for index, (attn_norm, w_qkv, wo, mlp_norm, w_gate_up, w_down) in enumerate(layers):
            h = rms_norm(x, attn_norm, eps)
            qkv = F.linear(h, w_qkv).view(n, hq + 2 * hkv, d)
            qk = apply_rotary(qkv[:, : hq + hkv], cos, sin)  # q and k turn by the same angles
            q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv :]
            x = x + F.linear(attend(index, q, k, v).reshape(n, cfg.dim), wo)
            h = rms_norm(x, mlp_norm, eps)
            gate, up = F.linear(h, w_gate_up).split(cfg.hidden_dim, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w_down)
        return rms_norm(x, final_norm, eps)

    def _weights(self) -> Tuple[torch.Tensor, List[Tuple[torch.Tensor, ...]], torch.Tensor]:
        """The weights ``run`` uses, each layer's q/k/v and gate/up stacked so each is one matmul.

        Without gradients they are kept until a parameter changes (its identity, storage or
        version counter tells: ``load_state_dict``, ``.to()``, an in-place edit); with
        gradients (training) they are stacked afresh so gradients reach the parameters.
        The parameters themselves stay separate.
        """
        # Read straight from the modules' parameter dicts: ``parameters()`` and attribute
        # lookups cost more than the check itself on a one-token step.
        params: List[torch.Tensor] = [self.embed.weight, self.norm.weight]
        decoder_layers = cast(List[DecoderLayer], list(self.layers))
        for layer in decoder_layers:
            params.extend(cast(torch.Tensor, module._parameters["weight"]) for module in layer._modules.values()
                          if module is not None)
        key = tuple((id(p), p.data_ptr(), p._version) for p in params)
        if not torch.is_grad_enabled() and self._weights_cache is not None and self._weights_cache[0] == key:
            return self._weights_cache[1]
        layers: List[Tuple[torch.Tensor, ...]] = [
            (
                layer.attn_norm.weight,
                torch.cat((layer.wq.weight, layer.wk.weight, layer.wv.weight)),
                layer.wo.weight,
                layer.mlp_norm.weight,
                torch.cat((layer.w_gate.weight, layer.w_up.weight)),
                layer.w_down.weight,
            )
            for layer in decoder_layers
        ]
        weights = (self.embed.weight, layers, self.norm.weight)
        if not torch.is_grad_enabled():
            self._weights_cache = (key, weights, params)  # params kept alive: their ids stay unique
        return weights

    def tokens(self, token_ids: TokenBatch) -> torch.Tensor:
        """``token_ids`` as an int64 tensor on the model's device, every id inside the vocabulary."""
        if isinstance(token_ids, torch.Tensor):
            if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex or token_ids.dtype == torch.bool:
                raise InvalidTypeError(f"token ids must be integers, got a {token_ids.dtype} tensor")
        elif isinstance(token_ids, (str, bytes)):
            raise InvalidTypeError(f"token ids must be ints, got a {type(token_ids).__name__}: encode() text first")
        try:
            t = torch.as_tensor(token_ids, dtype=torch.int64, device=self.device)
        except (TypeError, ValueError, RuntimeError) as err:
            raise InvalidTypeError(f"token ids must be ints, got {token_ids!r}") from err
        if t.numel():
            check_vocab([int(t.min()), int(t.max())], self.config.vocab_size)
        return t

    # ------------------------------------------------------------ no cache
    def forward(self, token_ids: TokenBatch) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` for ``token_ids`` ``[seq]`` or ``[batch, seq]``, no cache.

        Every call recomputes every position: the slow, obviously right reference.
        """
        tokens = self.tokens(token_ids)
        if tokens.dim() == 1:
            tokens = tokens[None]
        if tokens.dim() != 2 or tokens.shape[1] == 0:
            raise InvalidArgumentError(
                f"token_ids must be [seq] or [batch, seq] with seq >= 1, got shape {tuple(tokens.shape)}"
            )
        batch, seq = tokens.shape
        positions = torch.arange(seq, device=self.device).repeat(batch)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=self.device).tril()[None]

        def attend(_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q, k, v = (t.view(batch, seq, *t.shape[1:]) for t in (q, k, v))
            return dense_attention(q, k, v, mask).reshape(batch * seq, *q.shape[2:])

        hidden = self.run(tokens.reshape(-1), positions, attend)
        return self.lm_head(hidden).view(batch, seq, -1)

    def forward_contiguous(
        self, token_ids: TokenBatch, cache: contiguous.ContiguousKVCache, rows: Optional[Sequence[int]] = None
    ) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` of new tokens ``[batch, seq]`` appended to cache rows.

        Row ``b`` of the batch continues cache row ``rows[b]`` (default: row ``b``), whose
        K/V slab was reserved for ``cache.max_len`` tokens up front.
        """
        return contiguous.forward_contiguous(self, token_ids, cache, rows)

    def forward_paged(
        self,
        allocator: PagedKVView,
        seq_ids: Sequence[int],
        chunks: Sequence[TokenIds],
        *,
        write: Optional[Sequence[bool]] = None,
        decode_attention: Optional[DecodeAttention] = None,
    ) -> torch.Tensor:
        """Run the newest tokens of several sequences with a paged cache; logits of each chunk's last token.

        ``chunks[i]`` holds the *last* ``len(chunks[i])`` tokens of sequence ``seq_ids[i]``,
        which the allocator must already count. Their K/V goes to the slots the block tables
        map them to (unless ``write[i]`` is False: the prefix cache already holds it), then
        each token attends causally to its sequence (decode steps through ``decode_attention`` when
        given). Returns ``[len(seq_ids), vocab]``; ``paged.forward_paged`` tells the details.
        """
        return paged.forward_paged(self, allocator, seq_ids, chunks, write=write, decode_attention=decode_attention)

    def check_allocator(self, allocator: PagedKVView) -> None:
        """Raise ``InvalidArgumentError`` unless the allocator's cache has this model's K/V shape."""
        paged.check_allocator(self, allocator)

    def new_allocator(self, num_blocks: int, block_size: int, **options) -> PagedKVCacheAllocator:
        """A ``PagedKVCacheAllocator`` whose cache has this model's layers, heads, dtype and device."""
        cfg = self.config
        return PagedKVCacheAllocator(
            num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device,
            num_layers=cfg.num_layers, **options,
        )
