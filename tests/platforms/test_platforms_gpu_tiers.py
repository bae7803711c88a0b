"""GPU tiers without a GPU: the CUDA capability and bf16 support are stubbed, so the rule that
picks the attention backend and the half precision is tested here on the CPU."""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib.attention import api, preferred_dtype, resolve_backend

CUDA = torch.device("cuda")


@pytest.fixture
def gpu(monkeypatch):
    """A pretend CUDA GPU with Triton installed; call it with the capability to report."""
    monkeypatch.setattr(api, "triton_available", lambda: True)
    monkeypatch.setattr(api, "_told", set())

    def report(capability, bf16=True):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)

    return report


@pytest.mark.parametrize("capability, expected", [((7, 5), "torch"), ((7, 0), "torch"), ((8, 0), "triton"),
                                                  ((8, 6), "triton"), ((9, 0), "triton"), ((10, 0), "triton")])
def test_auto_is_triton_from_capability_8_0(gpu, capability, expected):
    gpu(capability)
    assert resolve_backend("auto", CUDA) == expected


def test_a_t4_gets_torch_with_one_line_saying_why_once(gpu, capsys):
    gpu((7, 5))
    assert resolve_backend("auto", CUDA) == "torch"
    assert resolve_backend("auto", CUDA) == "torch"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert "sm_75" in lines[0] and "sm_80" in lines[0] and "torch backend" in lines[0]


def test_a_new_gpu_says_nothing(gpu, capsys):
    gpu((9, 0))
    resolve_backend("auto", CUDA)
    assert capsys.readouterr().err == ""


def test_an_explicit_backend_is_kept_whatever_the_gpu(gpu):
    gpu((7, 5))
    assert resolve_backend("triton", CUDA) == "triton"
    gpu((9, 0))
    assert resolve_backend("torch", CUDA) == "torch"


def test_the_cpu_never_asks_for_a_capability(monkeypatch):
    def boom(device=None):
        raise AssertionError("asked a CPU for its CUDA capability")

    monkeypatch.setattr(torch.cuda, "get_device_capability", boom)
    assert resolve_backend("auto", torch.device("cpu")) == "torch"


@pytest.mark.parametrize("bf16, expected", [(True, torch.bfloat16), (False, torch.float16)])
def test_half_precision_is_fp16_where_bf16_is_missing(gpu, bf16, expected):
    gpu((7, 5) if not bf16 else (9, 0), bf16=bf16)
    assert preferred_dtype(CUDA) == expected
    assert preferred_dtype(torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("capability, backend", [((7, 5), "torch"), ((9, 0), "triton")])
def test_doctor_names_the_gpus_tier(gpu, monkeypatch, capability, backend):
    from paged_kv_lib.cli import doctor_report

    gpu(capability)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    row = dict(doctor_report())["cuda"]
    assert f"sm_{capability[0]}{capability[1]}" in row and f"attention backend {backend}" in row
    assert ("need sm_80" in row) == (backend == "torch")
