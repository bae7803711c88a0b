"""The Triton kernels on a CUDA GPU: big shapes, int64 offsets and a speed sanity check.

Kept apart from ``test_attention_triton.py`` so ``gpu_check`` (pytest-xdist, one file per
worker) compiles these kernels on a worker of their own. Every test skips without CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from paged_kv_lib.attention import paged_attention, paged_attention_extend  # noqa: E402
from paged_kv_lib.attention.testing import TOLERANCES, make_paged_batch, sdpa_decode, sdpa_extend  # noqa: E402

from paged_kv_lib.attention import MIN_TRITON_CAPABILITY  # noqa: E402

# The kernels are built for compute capability 8.0 and newer; below it "auto" runs torch (GPU tiers).
cuda_only = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_TRITON_CAPABILITY,
    reason="needs a CUDA GPU of compute capability 8.0 or newer (big shapes, speed)",
)


def assert_matches(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, **TOLERANCES[dtype])


def decode(batch, **kwargs):
    return paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, backend="triton", **kwargs
    )


def extend(batch, **kwargs):
    return paged_attention_extend(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.query_start_loc, backend="triton", **kwargs,
    )


# ----------------------------------------------------------------------- CUDA only
@cuda_only
@pytest.mark.cuda
@pytest.mark.parametrize("dtype, num_splits", [(torch.bfloat16, None), (torch.bfloat16, 8), (torch.float16, 1)])
def test_cuda_big_decode(dtype, num_splits):
    lens = [4096, 1, 777, 2048, 3000, 16, 1500, 4095]
    batch = make_paged_batch(lens, num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16, dtype=dtype, device="cuda", spare_blocks=50, pad_columns=3)
    assert_matches(decode(batch, num_splits=num_splits), sdpa_decode(batch), dtype)


@cuda_only
@pytest.mark.cuda
@pytest.mark.parametrize("head_dim, block_size", [(64, 1), (96, 32), (256, 16), (128, 256)])
def test_cuda_decode_shapes(head_dim, block_size):
    batch = make_paged_batch([1000, 33, 512], num_q_heads=8, num_kv_heads=2, head_dim=head_dim, block_size=block_size, dtype=torch.bfloat16, device="cuda")
    for num_splits in (1, 4):
        assert_matches(decode(batch, num_splits=num_splits), sdpa_decode(batch), torch.bfloat16)


@cuda_only
@pytest.mark.cuda
def test_cuda_fp32_is_exact():
    batch = make_paged_batch([2000, 100], num_q_heads=4, num_kv_heads=4, head_dim=64, block_size=16, device="cuda")
    assert_matches(decode(batch), sdpa_decode(batch), torch.float32)


@cuda_only
@pytest.mark.cuda
def test_cuda_big_extend():
    lens = [2048, 600, 130, 1]
    batch = make_paged_batch(lens, num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.bfloat16, device="cuda", query_lens=[2048, 100, 1, 1])
    assert_matches(extend(batch), sdpa_extend(batch), torch.bfloat16)


@cuda_only
@pytest.mark.cuda
def test_cuda_offsets_past_2_31_elements():
    """A cache of more than 2**31 elements: block ids near the end need int64 offsets."""
    free = torch.cuda.mem_get_info()[0]
    block_size, head_dim = 16, 128
    num_blocks = (1 << 31) // (block_size * head_dim) + 64
    if free < 3 * num_blocks * block_size * head_dim * 2:
        pytest.skip("not enough GPU memory for a >2**31-element cache")
    k_cache = torch.zeros(num_blocks, 1, block_size, head_dim, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    small = make_paged_batch([40], num_q_heads=2, num_kv_heads=1, head_dim=head_dim, block_size=block_size, dtype=torch.bfloat16, device="cuda")
    ids = torch.arange(num_blocks - 3, num_blocks, device="cuda", dtype=torch.int32)
    k_cache[ids] = small.k_cache[small.block_tables[0].long()]
    v_cache[ids] = small.v_cache[small.block_tables[0].long()]
    out = paged_attention(small.q, k_cache, v_cache, ids[None], small.seq_lens, backend="triton")
    assert_matches(out, sdpa_decode(small), torch.bfloat16)
    del k_cache, v_cache


@cuda_only
@pytest.mark.cuda
def test_cuda_bf16_speed_sanity():
    """The kernel must beat the gather-then-attend reference and stay near SDPA on equal lengths."""
    import triton.testing

    batch = make_paged_batch([2048] * 32, num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.bfloat16, device="cuda", poison=False)
    kernel_ms = triton.testing.do_bench(lambda: decode(batch, check_values=False))
    reference_ms = triton.testing.do_bench(lambda: paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, backend="torch"))
    k = torch.stack(batch.keys)
    v = torch.stack(batch.values)
    q = batch.q[:, :, None]
    sdpa_ms = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    assert kernel_ms < reference_ms / 5, (kernel_ms, reference_ms)
    assert kernel_ms < 2.5 * sdpa_ms, (kernel_ms, sdpa_ms)
