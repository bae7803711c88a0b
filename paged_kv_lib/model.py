"""A tiny decoder-only transformer whose attention keeps its K/V in the paged cache.

The architecture is the one of today's open models, shrunk: byte-level tokens, RMSNorm,
rotary positions, grouped-query attention and a gated (SwiGLU) MLP. One layer body is
shared by three ways of running it, so they differ only in where K/V lives:

* :meth:`TinyTransformer.forward` recomputes the whole sequence (no cache): the reference.
* :meth:`TinyTransformer.forward_contiguous` keeps K/V in a :class:`ContiguousKVCache`,
  one worst-case slab per sequence: what engines did before paging.
* :meth:`TinyTransformer.forward_paged` writes K/V through the allocator's slot mapping
  and reads it with ``paged_attention``: what the engine runs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.nn import functional as F

from ._validate import as_count
from .allocator import PagedKVCacheAllocator
from .attention import paged_attention, paged_attention_extend, resolve_backend
from .attention.batched import BatchPlan, plan_batch
from .attention.batched import attend as attend_batched
from .cache_ops import write_slots

NUM_BYTES = 256
BOS_ID = 256  # beginning of text; the only id that is not a byte
VOCAB_SIZE = NUM_BYTES + 1
CHECKPOINT = "tiny_model.pt"

TokenIds = Union[Sequence[int], torch.Tensor]


def encode(text: str, *, bos: bool = True) -> List[int]:
    """UTF-8 bytes of ``text`` as token ids, after ``BOS_ID`` unless ``bos=False``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return ([BOS_ID] if bos else []) + list(text.encode("utf-8"))


def decode(token_ids: TokenIds) -> str:
    """Token ids back to text; BOS is dropped and broken UTF-8 shows as U+FFFD."""
    ids = token_ids.tolist() if isinstance(token_ids, torch.Tensor) else list(token_ids)
    return bytes(i for i in ids if 0 <= i < NUM_BYTES).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of a :class:`TinyTransformer`. The defaults are the test-sized model."""

    vocab_size: int = VOCAB_SIZE
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    hidden_dim: int = 172
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads", "hidden_dim"):
            as_count(getattr(self, name), name, minimum=1)
        if self.vocab_size < VOCAB_SIZE:
            raise ValueError(f"vocab_size must be >= {VOCAB_SIZE} (bytes + BOS), got {self.vocab_size}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary positions")
        if not self.rope_theta > 0 or not self.norm_eps > 0:
            raise ValueError("rope_theta and norm_eps must be positive")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


# --------------------------------------------------------------------------- layers
class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned gain."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` scaled to unit root-mean-square over its last axis, times ``weight``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` ``[n, 1, head_dim // 2]`` of the angles ``pos * freq`` of each position.

    They depend only on the positions, so a forward computes them once for every layer.
    """
    angles = positions.to(torch.float32)[:, None] * _rotary_freqs(head_dim, theta, positions.device)[None, :]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


@functools.lru_cache(maxsize=16)
def _rotary_freqs(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """The per-channel-pair frequencies ``theta ** (-i / (d/2))``, computed once per shape."""
    half = head_dim // 2
    return theta ** (-torch.arange(half, device=device, dtype=torch.float32) / half)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn pairs of channels ``(i, i + d/2)`` of ``x`` ``[n, heads, d]`` by the tabled angles."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary positions: turn pairs of channels of ``x`` ``[n, heads, d]`` by angle ``pos * freq``.

    Each token is rotated by its own position only, so the result for a token does not
    depend on which other tokens share the batch (what makes the three paths agree).
    """
    return apply_rotary(x, *rotary_tables(positions, x.shape[-1], theta))


class DecoderLayer(nn.Module):
    """Pre-norm attention and SwiGLU MLP, each added back to the residual stream."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w_gate = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w_down = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)


# Given (layer index, q, k, v) for the packed tokens, return the attention output.
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


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
    def _run(self, tokens: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """Hidden states ``[n, dim]`` of packed ``tokens`` ``[n]`` at ``positions`` ``[n]``."""
        cfg = self.config
        n, eps, d = tokens.shape[0], cfg.norm_eps, cfg.head_dim
        hq, hkv = cfg.num_heads, cfg.num_kv_heads
        cos, sin = rotary_tables(positions, d, cfg.rope_theta)
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
        """The weights ``_run`` uses, each layer's q/k/v and gate/up stacked so each is one matmul.

        Without gradients they are kept until a parameter changes (its identity, storage or
        version counter tells: ``load_state_dict``, ``.to()``, an in-place edit); with
        gradients (training) they are stacked afresh so gradients reach the parameters.
        The parameters themselves stay separate.
        """
        # Read straight from the modules' parameter dicts: ``parameters()`` and attribute
        # lookups cost more than the check itself on a one-token step.
        params = [self.embed._parameters["weight"], self.norm._parameters["weight"]]
        for layer in self.layers:
            params.extend(module._parameters["weight"] for module in layer._modules.values())
        key = tuple((id(p), p.data_ptr(), p._version) for p in params)
        if not torch.is_grad_enabled() and self._weights_cache is not None and self._weights_cache[0] == key:
            return self._weights_cache[1]
        layers = [
            (
                layer.attn_norm.weight,
                torch.cat((layer.wq.weight, layer.wk.weight, layer.wv.weight)),
                layer.wo.weight,
                layer.mlp_norm.weight,
                torch.cat((layer.w_gate.weight, layer.w_up.weight)),
                layer.w_down.weight,
            )
            for layer in self.layers
        ]
        weights = (self.embed.weight, layers, self.norm.weight)
        if not torch.is_grad_enabled():
            self._weights_cache = (key, weights, params)  # params kept alive: their ids stay unique
        return weights

    def _tokens(self, token_ids: TokenIds) -> torch.Tensor:
        t = torch.as_tensor(token_ids, dtype=torch.int64, device=self.device)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.config.vocab_size):
            bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        return t

    # ------------------------------------------------------------ no cache
    def forward(self, token_ids: TokenIds) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` for ``token_ids`` ``[seq]`` or ``[batch, seq]``, no cache.

        Every call recomputes every position: the slow, obviously right reference.
        """
        tokens = self._tokens(token_ids)
        if tokens.dim() == 1:
            tokens = tokens[None]
        if tokens.dim() != 2 or tokens.shape[1] == 0:
            raise ValueError(f"token_ids must be [seq] or [batch, seq] with seq >= 1, got {tuple(tokens.shape)}")
        batch, seq = tokens.shape
        positions = torch.arange(seq, device=self.device).repeat(batch)

        def attend(_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q, k, v = (t.view(batch, seq, *t.shape[1:]) for t in (q, k, v))
            mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
            return dense_attention(q, k, v, mask[None]).reshape(batch * seq, *q.shape[2:])

        hidden = self._run(tokens.reshape(-1), positions, attend)
        return self.lm_head(hidden).view(batch, seq, -1)

    # ------------------------------------------------------------ contiguous
    def forward_contiguous(
        self, token_ids: TokenIds, cache: "ContiguousKVCache", rows: Optional[Sequence[int]] = None
    ) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` of new tokens ``[batch, seq]`` appended to cache rows.

        Row ``b`` of the batch continues cache row ``rows[b]`` (default: row ``b``), whose
        K/V slab was reserved for ``cache.max_len`` tokens up front.
        """
        tokens = self._tokens(token_ids)
        if tokens.dim() == 1:
            tokens = tokens[None]
        batch, seq = tokens.shape
        rows_t = torch.arange(batch) if rows is None else torch.as_tensor(list(rows), dtype=torch.int64)
        if rows_t.shape[0] != batch:
            raise ValueError(f"rows has {rows_t.shape[0]} entries for a batch of {batch}")
        starts = cache.lengths[rows_t]
        end = int(starts.max()) + seq
        if end > cache.max_len:
            raise ValueError(f"cache rows hold at most max_len={cache.max_len} tokens, this needs {end}")
        positions = (starts[:, None] + torch.arange(seq)[None, :]).to(self.device)
        key_pos = torch.arange(end, device=self.device)
        mask = key_pos[None, None, :] <= positions[:, :, None]  # [batch, seq, end]
        dst_rows = rows_t.to(self.device)[:, None].expand(batch, seq)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_slab, v_slab = cache.k[layer], cache.v[layer]
            k_slab[dst_rows, positions] = k.view(batch, seq, *k.shape[1:])
            v_slab[dst_rows, positions] = v.view(batch, seq, *v.shape[1:])
            k_all, v_all = k_slab[rows_t, :end], v_slab[rows_t, :end]
            out = dense_attention(q.view(batch, seq, *q.shape[1:]), k_all, v_all, mask)
            return out.reshape(batch * seq, *q.shape[1:])

        hidden = self._run(tokens.reshape(-1), positions.reshape(-1), attend)
        cache.lengths[rows_t] += seq
        return self.lm_head(hidden).view(batch, seq, -1)

    # ------------------------------------------------------------ paged
    def forward_paged(
        self,
        allocator: PagedKVCacheAllocator,
        seq_ids: Sequence[int],
        chunks: Sequence[TokenIds],
        *,
        write: Optional[Sequence[bool]] = None,
    ) -> torch.Tensor:
        """Run the newest tokens of several sequences with a paged cache; logits of each chunk's last token.

        ``chunks[i]`` holds the *last* ``len(chunks[i])`` tokens of sequence ``seq_ids[i]``,
        which the allocator must already count (the engine allocated or appended them).
        Their K/V goes to the slots the allocator maps them to (unless ``write[i]`` is
        False: the prefix cache already holds it); those slots are the sequence's own,
        since growing a sequence copies a shared last block first (copy-on-write inside
        ``append_tokens``). Then each token attends causally to its sequence.

        The whole batch is handled at once: one block-table tensor, one slot mapping, one
        K/V write and one attention call per layer, rotary and norms on the packed tokens.
        Attention is decode attention when every chunk is one token, else extend
        attention. Returns ``[len(seq_ids), vocab]``.
        """
        self.check_allocator(allocator)
        seq_ids = list(seq_ids)
        if len(chunks) != len(seq_ids) or not seq_ids:
            raise ValueError(f"need one non-empty chunk per sequence: {len(seq_ids)} ids, {len(chunks)} chunks")
        write = [True] * len(seq_ids) if write is None else [bool(w) for w in write]
        if len(write) != len(seq_ids):
            raise ValueError(f"write has {len(write)} entries for {len(seq_ids)} sequences")
        id_lists = [c.reshape(-1).tolist() if isinstance(c, torch.Tensor) else list(c) for c in chunks]
        q_lens = [len(ids) for ids in id_lists]
        lens = [allocator.get_num_tokens(s) for s in seq_ids]
        for seq_id, n, seq_len in zip(seq_ids, q_lens, lens):
            if not 1 <= n <= seq_len:
                raise ValueError(f"sequence {seq_id} holds {seq_len} tokens; a chunk of {n} cannot be its newest")
        flat = [t for ids in id_lists for t in ids]
        vocab = self.config.vocab_size
        for t in (min(flat), max(flat)):  # checked on the list: no tensor reductions per step
            if not 0 <= t < vocab:
                raise ValueError(f"token id {t} is outside the vocabulary [0, {vocab})")
        tokens = torch.tensor(flat, dtype=torch.int64, device=self.device)
        batch = PagedBatch.build(allocator, seq_ids, lens, q_lens, write, self.config.num_kv_heads)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = allocator.k_caches[layer], allocator.v_caches[layer]
            if batch.write_rows is None:
                write_slots(k_cache, v_cache, batch.slots, k, v)
            else:
                write_slots(k_cache, v_cache, batch.slots, k[batch.write_rows], v[batch.write_rows])
            return batch.attention(q, k_cache, v_cache)

        hidden = self._run(tokens, batch.positions, attend)
        return self.lm_head(hidden if batch.decode else hidden[batch.last_rows])

    def check_allocator(self, allocator: PagedKVCacheAllocator) -> None:
        """Raise ``ValueError`` unless the allocator's cache has this model's K/V shape."""
        cfg = self.config
        want = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device)
        have = (allocator.num_layers, allocator.num_heads, allocator.head_dim, allocator.dtype, allocator.device)
        if want != have or not allocator.k_caches:
            raise ValueError(
                "the allocator's cache does not fit this model: need (num_layers, num_kv_heads, "
                f"head_dim, dtype, device) = {want}, got {have}"
                + ("" if allocator.k_caches else " and allocate_cache=False")
            )

    def new_allocator(self, num_blocks: int, block_size: int, **options) -> PagedKVCacheAllocator:
        """A ``PagedKVCacheAllocator`` whose cache has this model's layers, heads, dtype and device."""
        cfg = self.config
        return PagedKVCacheAllocator(
            num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device,
            num_layers=cfg.num_layers, **options,
        )


@dataclass
class PagedBatch:
    """Everything one paged forward needs about its batch, built once and shared by every layer.

    ``positions`` and ``slots`` cover the packed new tokens (``slots`` only those whose K/V
    is written: ``write_rows`` picks them, ``None`` meaning all); ``block_tables`` and
    ``seq_lens`` are the attention's inputs; ``plan`` is the batched torch attention's
    gather index, or ``None`` when the Triton backend serves the batch.
    """

    decode: bool
    positions: torch.Tensor
    slots: torch.Tensor
    write_rows: Optional[torch.Tensor]
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    last_rows: torch.Tensor
    max_query_len: int
    plan: Optional[BatchPlan]

    @classmethod
    def build(
        cls,
        allocator: PagedKVCacheAllocator,
        seq_ids: List[int],
        lens: List[int],
        q_lens: List[int],
        write: List[bool],
        num_kv_heads: int,
    ) -> "PagedBatch":
        device = allocator.device
        num_seqs, block_size = len(seq_ids), allocator.block_size
        seq_lens = torch.tensor(lens, dtype=torch.int64, device=device)
        decode = max(q_lens) == 1
        if decode:
            query_start_loc = torch.arange(num_seqs + 1, device=device)
            seq_of = query_start_loc[:-1]
            positions = seq_lens - 1
        else:
            q_lens_t = torch.tensor(q_lens, dtype=torch.int64, device=device)
            query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int64, device=device)
            torch.cumsum(q_lens_t, 0, out=query_start_loc[1:])
            seq_of = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens_t, output_size=sum(q_lens))
            within = torch.arange(seq_of.shape[0], device=device) - query_start_loc[seq_of]
            positions = (seq_lens - q_lens_t)[seq_of] + within
        block_tables = allocator.block_table_tensor(seq_ids)
        # The slot mapping of every new token at once: its block through its row of the table.
        slots = block_tables[seq_of, positions // block_size].long() * block_size + positions % block_size
        write_rows = None
        if not all(write):
            keep = torch.tensor(write, device=device)[seq_of]
            write_rows = keep.nonzero().flatten()
            slots = slots[write_rows]
        plan = None
        if resolve_backend("auto", device) == "torch":
            plan = plan_batch(block_tables, seq_lens, num_kv_heads, block_size, None if decode else query_start_loc)
        return cls(
            decode, positions, slots, write_rows, block_tables, seq_lens.to(torch.int32),
            query_start_loc.to(torch.int32), query_start_loc[1:] - 1, max(q_lens), plan,
        )

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Paged attention of the batch's queries over one layer's cache."""
        if self.plan is not None:  # the torch backend, with the gather index built once
            return attend_batched(q, k_cache, v_cache, self.plan)
        if self.decode:
            return paged_attention(q, k_cache, v_cache, self.block_tables, self.seq_lens)
        return paged_attention_extend(
            q, k_cache, v_cache, self.block_tables, self.seq_lens, self.query_start_loc,
            max_query_len=self.max_query_len,
        )


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention on contiguous tensors: ``q`` ``[b, n_q, hq, d]``, ``k``/``v`` ``[b, n_k, hkv, d]``.

    ``mask`` ``[b, n_q, n_k]`` says which keys each query sees. Scores and softmax in
    float32, as in the paged reference. Returns ``[b, n_q, hq, d]``.
    """
    group = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2).float()  # [b, hq, n_q, d]
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1).float()
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1).float()
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2).to(q.dtype)


class ContiguousKVCache:
    """Per-sequence K/V slabs reserved at full length up front (worst-case reservation).

    ``k[layer]``/``v[layer]`` are ``[batch, max_len, num_kv_heads, head_dim]``; row ``b``
    holds ``lengths[b]`` tokens. Every row costs ``max_len`` slots whether used or not:
    the waste paging removes.
    """

    def __init__(self, model: TinyTransformer, batch_size: int, max_len: int) -> None:
        cfg = model.config
        self.batch_size = as_count(batch_size, "batch_size", minimum=1)
        self.max_len = as_count(max_len, "max_len", minimum=1)
        shape = (cfg.num_layers, batch_size, max_len, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.v = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.lengths = torch.zeros(batch_size, dtype=torch.int64)

    @property
    def reserved_slots(self) -> int:
        """Token slots reserved per layer: ``batch_size * max_len``."""
        return self.batch_size * self.max_len

    def reset_row(self, row: int) -> None:
        """Forget row ``row`` so a new sequence can use its slab."""
        self.lengths[row] = 0


# --------------------------------------------------------------------------- sampling
def sample_generator(seed: int, sample_index: int = 0) -> torch.Generator:
    """The random stream of sample ``sample_index`` of a request seeded with ``seed``.

    One stream per sample, drawn from once per generated position, makes sampling
    independent of batch composition and of preemption.
    """
    seed = as_count(seed, "seed")
    sample_index = as_count(sample_index, "sample_index")
    return torch.Generator().manual_seed((seed * 1_000_003 + sample_index) % (2**63))


def sample_token(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> int:
    """Pick the next token from ``logits`` ``[vocab]``: argmax at temperature 0, else one draw.

    A draw uses exactly one uniform number from ``generator`` (inverse CDF), so replaying
    the same stream gives the same tokens.
    """
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    cdf = probs.cumsum(0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), logits.shape[0] - 1)


def check_temperature(temperature: float) -> float:
    """A finite temperature >= 0 as a float (0 means greedy)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a float, got {type(temperature).__name__} {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0, got {temperature!r}")
    return float(temperature)


# --------------------------------------------------------------------------- references
def _prompt(prompt_ids: TokenIds) -> List[int]:
    ids = prompt_ids.tolist() if isinstance(prompt_ids, torch.Tensor) else list(prompt_ids)
    if not ids:
        raise ValueError("the prompt must hold at least one token")
    return ids


@torch.no_grad()
def generate_no_cache(
    model: TinyTransformer,
    prompt_ids: TokenIds,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    sample_index: int = 0,
) -> List[int]:
    """Generate by rerunning the whole sequence each step; returns the new token ids."""
    ids = _prompt(prompt_ids)
    max_new_tokens = as_count(max_new_tokens, "max_new_tokens")
    temperature = check_temperature(temperature)
    gen = sample_generator(seed, sample_index)
    out: List[int] = []
    for _ in range(max_new_tokens):
        logits = model(ids + out)[0, -1]
        out.append(sample_token(logits, temperature, gen))
    return out


@torch.no_grad()
def generate_contiguous(
    model: TinyTransformer,
    prompt_ids: TokenIds,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    sample_index: int = 0,
) -> List[int]:
    """Generate with a contiguous K/V cache reserved for prompt + max_new_tokens; returns the new ids."""
    ids = _prompt(prompt_ids)
    max_new_tokens = as_count(max_new_tokens, "max_new_tokens")
    temperature = check_temperature(temperature)
    gen = sample_generator(seed, sample_index)
    cache = ContiguousKVCache(model, 1, len(ids) + max_new_tokens)
    out: List[int] = []
    step_input = ids
    for _ in range(max_new_tokens):
        logits = model.forward_contiguous([step_input], cache)[0, -1]
        out.append(sample_token(logits, temperature, gen))
        step_input = out[-1:]
    return out


# --------------------------------------------------------------------------- checkpoint
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
