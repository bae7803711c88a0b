"""One rule for Triton on a GPU (issue 34, item 6): every notebook that turns on Triton's interpreter does so
unless there is a CUDA GPU of compute capability 8.0 or newer, as lesson 09 and the library decide; a T4
(sm_75) runs the interpreter on CPU tensors, never kernels compiled for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from paged_kv_course.grading.notebook_tasks import read_notebook

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted([*ROOT.glob("lessons/*.ipynb"), *ROOT.glob("exercises/*.ipynb"),
                    *ROOT.glob("exercises/solutions/*.ipynb")])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_interpreter_rule_checks_the_capability(path):
    for cell in read_notebook(path).cells:
        if cell.cell_type == "code" and 'setdefault("TRITON_INTERPRET", "1")' in cell.source:
            assert "get_device_capability" in cell.source, "the interpreter is chosen by CUDA alone"
            assert "if not torch.cuda.is_available():" not in cell.source


def _interpreted(path: Path, capability) -> bool:
    """Whether the setup cell of ``path`` turns the interpreter on, on a machine with this CUDA capability
    (None: no CUDA): its condition line, evaluated against a stand-in for torch."""
    from types import SimpleNamespace

    cuda = SimpleNamespace(is_available=lambda: capability is not None,
                           get_device_capability=lambda device=0: capability)
    for cell in read_notebook(path).cells:
        for line in cell.source.splitlines():
            if line.startswith("if not (torch.cuda.is_available()"):
                return eval(line[len("if "):].rstrip(":"), {"torch": SimpleNamespace(cuda=cuda)})
    raise AssertionError(f"{path.name}: no setup condition")


@pytest.mark.parametrize("capability, interpreted", [(None, True), ((7, 5), True), ((8, 0), False), ((9, 0), False)])
@pytest.mark.parametrize("name", ["exercises/09_paged_attention.ipynb", "exercises/10_the_whole_engine.ipynb",
                                  "lessons/04_address_translation.ipynb", "lessons/05_growing_on_demand.ipynb"])
def test_the_rule_sends_a_t4_to_the_interpreter(name, capability, interpreted):
    assert _interpreted(ROOT / name, capability) is interpreted
