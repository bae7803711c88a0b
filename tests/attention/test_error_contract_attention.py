"""The error contract for attention: every bad argument raises a PagedKVError that is also the
built-in a caller expects, names the value and the limit, and changes no input tensor."""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib.attention import check_supported, paged_attention, paged_attention_extend, resolve_backend
from paged_kv_lib.attention.testing import make_paged_batch
from paged_kv_lib.errors import InvalidArgumentError, InvalidTypeError, PagedKVError

HQ, HKV, D, BS = 4, 2, 16, 4
LENS = [5, 3]


def decode_case():
    b = make_paged_batch(LENS, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, block_size=BS, poison=False)
    return dict(q=b.q, k_cache=b.k_cache, v_cache=b.v_cache, block_tables=b.block_tables, seq_lens=b.seq_lens)


def extend_case():
    b = make_paged_batch(LENS, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, block_size=BS, query_lens=[2, 1],
                         poison=False)
    return dict(q=b.q, k_cache=b.k_cache, v_cache=b.v_cache, block_tables=b.block_tables, seq_lens=b.seq_lens,
                query_start_loc=b.query_start_loc)


def with_(case, **changes):
    out = dict(case)
    out.update(changes)
    return out


# name -> (builds the arguments from a good case, the built-in expected, words the message must hold)
DECODE = {
    "q not a tensor": (lambda c: with_(c, q=c["q"].tolist()), TypeError, ["q", "list"]),
    "q 2-D": (lambda c: with_(c, q=c["q"][:, 0]), ValueError, ["q", "3-D", "(2, 16)"]),
    "q int dtype": (lambda c: with_(c, q=c["q"].long()), TypeError, ["torch.int64"]),
    "cache 3-D": (lambda c: with_(c, k_cache=c["k_cache"][0]), ValueError, ["k_cache", "4-D"]),
    "v_cache other shape": (lambda c: with_(c, v_cache=c["v_cache"][:1]), ValueError, ["v_cache", "differs"]),
    "cache other dtype": (lambda c: with_(c, k_cache=c["k_cache"].double()), TypeError, ["float64", "float32"]),
    "head_dim mismatch": (lambda c: with_(c, q=c["q"][..., :8]), ValueError, ["8", "16"]),
    "heads not a multiple": (lambda c: with_(c, q=c["q"][:, :3]), ValueError, ["3", "multiple", "2"]),
    "float block table": (lambda c: with_(c, block_tables=c["block_tables"].float()), TypeError, ["block_tables"]),
    "1-D block table": (lambda c: with_(c, block_tables=c["block_tables"][0]), ValueError, ["block_tables", "2"]),
    "seq_lens count": (lambda c: with_(c, seq_lens=c["seq_lens"][:1]), ValueError, ["seq_lens", "1", "2"]),
    "table rows": (lambda c: with_(c, block_tables=c["block_tables"][:1]), ValueError, ["block_tables", "1", "2"]),
    "negative length": (lambda c: with_(c, seq_lens=torch.tensor([-1, 3], dtype=torch.int32)), ValueError,
                        ["seq_lens[0]", "-1"]),
    "length past the row": (lambda c: with_(c, seq_lens=torch.tensor([99, 3], dtype=torch.int32)), ValueError,
                            ["99", "holds"]),
    "block id past the pool": (lambda c: with_(c, block_tables=torch.full_like(c["block_tables"], 1000)), ValueError,
                               ["1000", "[0,"]),
}
OPTIONS = {
    "scale zero": (dict(scale=0.0), ValueError, ["scale", "0.0"]),
    "scale a string": (dict(scale="1"), TypeError, ["scale", "str"]),
    "num_splits 3": (dict(num_splits=3), ValueError, ["num_splits", "power of two", "3"]),
    "num_splits a float": (dict(num_splits=2.0), TypeError, ["num_splits", "float"]),
    "unknown backend": (dict(backend="cuda"), ValueError, ["backend", "'cuda'"]),
    "check_values an int": (dict(check_values=1), TypeError, ["check_values", "int"]),
}
EXTEND = {
    "query_start_loc length": (lambda c: with_(c, query_start_loc=c["query_start_loc"][:2]), ValueError,
                               ["query_start_loc", "2", "3"]),
    "query_start_loc float": (lambda c: with_(c, query_start_loc=c["query_start_loc"].float()), TypeError,
                              ["query_start_loc"]),
    "query_start_loc not at 0": (lambda c: with_(c, query_start_loc=torch.tensor([1, 2, 3], dtype=torch.int32)),
                                 ValueError, ["start at 0", "3"]),
    "more queries than tokens": (lambda c: with_(c, seq_lens=torch.tensor([1, 3], dtype=torch.int32)), ValueError,
                                 ["2 new query tokens", "seq_lens[0] = 1"]),
}


def assert_contract(call, kwargs, builtin, words):
    before = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(PagedKVError) as info:
        call(**kwargs)
    err = info.value
    assert isinstance(err, builtin), f"{type(err).__name__} is not a {builtin.__name__}"
    assert isinstance(err, InvalidTypeError if builtin is TypeError else InvalidArgumentError)
    for word in words:
        assert word in str(err), f"{word!r} missing from: {err}"
    for name, tensor in before.items():
        assert torch.equal(kwargs[name], tensor), f"{name} changed"


@pytest.mark.parametrize("name", sorted(DECODE))
def test_decode_argument_checks(name) -> None:
    build, builtin, words = DECODE[name]
    assert_contract(lambda **kw: paged_attention(**kw, backend="torch"), build(decode_case()), builtin, words)


# The extend form counts its sequences from seq_lens and has its own query rows: these apply as they are.
SHARED = ["cache 3-D", "v_cache other shape", "cache other dtype", "float block table", "1-D block table",
          "length past the row", "block id past the pool"]


@pytest.mark.parametrize("name", SHARED)
def test_extend_shares_the_decode_checks(name) -> None:
    build, builtin, words = DECODE[name]
    assert_contract(lambda **kw: paged_attention_extend(**kw, backend="torch"), build(extend_case()), builtin, words)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_option_checks(name) -> None:
    options, builtin, words = OPTIONS[name]
    if "num_splits" in options:
        call = paged_attention
        case = decode_case()
    else:
        call = paged_attention_extend if "check_values" in options else paged_attention
        case = extend_case() if call is paged_attention_extend else decode_case()
    options = {"backend": "torch", **options}
    assert_contract(lambda **kw: call(**kw, **options), case, builtin, words)


@pytest.mark.parametrize("name", sorted(EXTEND))
def test_extend_argument_checks(name) -> None:
    build, builtin, words = EXTEND[name]
    assert_contract(lambda **kw: paged_attention_extend(**kw, backend="torch"), build(extend_case()), builtin, words)


def test_extend_max_query_len_checks() -> None:
    assert_contract(lambda **kw: paged_attention_extend(**kw, max_query_len=1), extend_case(), ValueError,
                    ["max_query_len=1", "2"])
    assert_contract(lambda **kw: paged_attention_extend(**kw, max_query_len="2"), extend_case(), TypeError,
                    ["max_query_len", "str"])


def test_check_supported_and_resolve_backend() -> None:
    with pytest.raises(InvalidArgumentError, match="multiple"):
        check_supported(3, 2, 16, torch.float32)
    with pytest.raises(InvalidArgumentError, match="head_dim must be from 16 to 256, got 8"):
        check_supported(4, 2, 8, torch.float32)
    with pytest.raises(InvalidTypeError, match="torch.int32"):
        check_supported(4, 2, 16, torch.int32)
    with pytest.raises(InvalidArgumentError, match="'gpu'"):
        resolve_backend("gpu", torch.device("cpu"))
