"""Exercise 09's checks bite: the solution notebook's cells pass, every planted wrong solution fails with its name.

The Triton tasks' code is loaded as a learner's notebook would run it: each cell's source is
written to a module after the notebook's setup imports (``@triton.jit`` reads a function's
source, so it must live in a file), then handed to the check, which launches it itself under
the interpreter. The planted files of ``tests/exercises/planted/09/`` are the same ones the
official-grader gate grades; here they run in-process, which is faster.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from paged_kv_lib.attention import paged_attention_reference
from paged_kv_course import triton_skeleton
# The checks themselves, not the notebook's guarded copies: these tests hand them the course's own classes.
from paged_kv_course.grading.checks_09 import (check_fold_tile, check_merge_softmax_states, check_paged_decode_kernel, check_split_k_decode, check_tile_addresses)
from paged_kv_course.grading import _checks_09_kernel as kernel_check
from paged_kv_course.grading._common import TaskNotWrittenError
from paged_kv_course.grading.delegation import forbidden_modules, is_forbidden

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "exercises" / "solutions" / "09_paged_attention.ipynb"
PLANTED = sorted((REPO / "tests" / "exercises" / "planted" / "09").glob("09_*.py"))
SETUP = "import math\nimport torch\nimport triton\nimport triton.language as tl\nfrom paged_kv_lib.block import cdiv\n\n"


def _cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]


def _solution_source(task: str) -> str:
    for cell in _cells():
        meta = cell.get("metadata", {}).get("paged_kv", {})
        if meta.get("role") == "solution" and meta.get("task") == task:
            return "".join(cell["source"])
    raise KeyError(task)


def _load(source: str, tmp_path: Path, name: str, before: str = ""):
    path = tmp_path / f"{name}.py"
    path.write_text(SETUP + before + "\n\n" + source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(task: str, module) -> None:
    if task == "09.1":
        check_tile_addresses(module.tile_addresses)
    elif task == "09.2":
        check_fold_tile(module.fold_tile)
    elif task == "09.3":
        check_merge_softmax_states(module.merge_softmax_states)
    elif task == "09.4":
        check_paged_decode_kernel(module.paged_decode_kernel, module.merge_splits_kernel)
    else:
        check_split_k_decode(module.split_k_decode)


TASKS = ["09.1", "09.2", "09.3", "09.4", "09.5"]


def _needs(task: str) -> str:
    return _solution_source("09.3") if task == "09.5" else ""  # 09.5 merges with the learner's 09.3


@pytest.mark.parametrize("task", TASKS)
def test_the_solution_cell_passes(task, tmp_path, capsys):
    _run(task, _load(_solution_source(task), tmp_path, f"solution_{task.replace('.', '_')}", _needs(task)))
    out = capsys.readouterr().out
    repair = "09.5: 5 lines changed from the given code (split_k_decode against split_k_decode_with_bugs; a repair " \
             "changes at most 7)\n" if task == "09.5" else ""
    assert out == f"{repair}PASSED {task}\n"


@pytest.mark.parametrize("path", PLANTED, ids=lambda p: p.stem)
def test_a_planted_solution_fails_with_its_name(path, tmp_path):
    text = path.read_text(encoding="utf-8")
    first, _, _ = text.partition("\n")
    assert first.startswith("# expect: ")
    expect = first[len("# expect: "):]
    task = path.stem[:2] + "." + path.stem[3]
    module = _load(text, tmp_path, path.stem, _needs(task))
    with pytest.raises(AssertionError) as info:
        _run(task, module)
    assert expect in str(info.value)
    assert "task " not in str(info.value)[:5]  # a wrong answer, not "not written"


def test_every_task_has_planted_solutions():
    planted = {p.stem[:4].replace("_", ".") for p in PLANTED}
    assert planted == set(TASKS)
    named = {p.stem for p in PLANTED}
    for mistake in ["one_block_too_far", "drops_seq_len_mask", "drops_block_mask", "wrong_gqa_heads",
                    "no_acc_rescale", "no_inf_guard", "skips_split_merge", "ignores_scale", "exp2_without_log2e",
                    "no_split", "computed_in_bf16", "not_a_kernel", "int32_block_offsets", "unmasked_table_load",
                    "unmasked_query_load"]:
        assert f"09_4_{mistake}" in named  # every mistake issues 22 and 34 name for the whole kernel
    for name in ["09_1_int32_offsets", "09_1_swapped_strides", "09_1_slot_is_position", "09_2_zero_d_sum",
                 "09_5_rewritten_as_gather"]:
        assert name in named  # issue 34's holes and misnamed hints in the warm-ups and the debug task


# --------------------------------------------------------------------------- untouched tasks
@triton.jit
def _untouched_addresses(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                         stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    raise NotImplementedError("Task 09.1: replace this line with your code")


@triton.jit
def _untouched_fold(m_i, l_i, acc, scores, v):
    raise NotImplementedError("Task 09.2: replace this line with your code")


def _untouched(*args, **kwargs):
    raise NotImplementedError("Task 09.3: replace this line with your code")


def test_untouched_triton_tasks_are_not_written():
    with pytest.raises(TaskNotWrittenError, match="task 09.1 is not written yet"):
        check_tile_addresses(_untouched_addresses)
    with pytest.raises(TaskNotWrittenError, match="task 09.2 is not written yet"):
        check_fold_tile(_untouched_fold)


def test_untouched_kernel_is_not_written(tmp_path):
    source = _solution_source("09.4")
    lines, out, skipping = source.splitlines(), [], False
    for line in lines:  # what the generator leaves of the cell
        if "### BEGIN SOLUTION" in line:
            out.append('    raise NotImplementedError("Task 09.4: replace this line with your code")')
            skipping = True
        elif "### END SOLUTION" in line:
            skipping = False
        elif not skipping:
            out.append(line)
    module = _load("\n".join(out), tmp_path, "untouched_09_4")
    with pytest.raises(TaskNotWrittenError, match="task 09.4 is not written yet"):
        check_paged_decode_kernel(module.paged_decode_kernel, module.merge_splits_kernel)


@pytest.mark.parametrize("check", [check_merge_softmax_states, check_split_k_decode])
def test_untouched_torch_tasks_are_not_written(check):
    with pytest.raises(NotImplementedError):
        check(_untouched)


def test_a_plain_function_instead_of_a_kernel_fails_with_the_error():
    def not_a_kernel(*args):
        return None

    with pytest.raises(AssertionError, match="not a Triton kernel: the task's point is the @triton.jit function"):
        check_paged_decode_kernel(not_a_kernel, not_a_kernel)
    with pytest.raises(AssertionError, match="not a Triton kernel"):
        check_tile_addresses(not_a_kernel)
    with pytest.raises(AssertionError, match="not a Triton kernel"):
        check_fold_tile(not_a_kernel)


def test_a_wrong_merge_shows_its_states_laid_out_on_lines_not_as_a_quoted_string():
    def keeps_the_first(a, b):
        return a

    with pytest.raises(AssertionError) as failure:
        check_merge_softmax_states(keeps_the_first)
    text = str(failure.value)
    assert "merge_softmax_states(a=(m=" in text and "\n l=" in text and "\n acc=" in text
    assert "\\n" not in text and "'(m=" not in text, "a state quoted as a string, its line breaks escaped"


# --------------------------------------------------------------------------- the check's own parts
def test_the_torch_replay_without_a_mistake_is_the_reference():
    for case in kernel_check._cases():
        out, parts = kernel_check._model(case)
        want = kernel_check._expected_out(case)
        assert torch.allclose(out, want.float(), atol=3e-2 if case.batch.q.dtype != torch.float32 else 1e-5)
        if case.splits > 1:  # the partials merge to the same output
            assert torch.allclose(kernel_check._merge(parts), out, atol=1e-5)


def test_a_dropped_block_is_left_out_of_the_expected_output():
    case = next(c for c in kernel_check._cases() if c.holes and c.splits == 1)
    b = case.batch
    i, j = case.holes[0][:2]
    bs = b.k_cache.shape[2]
    n = int(b.seq_lens[i])
    keep = [p for p in range(n) if p // bs != j]
    rows = b.block_tables[i].long()
    k = torch.stack([b.k_cache[rows[p // bs], :, p % bs] for p in keep]).float()  # [n', kv, d]
    v = torch.stack([b.v_cache[rows[p // bs], :, p % bs] for p in keep]).float()
    group = b.q.shape[1] // b.k_cache.shape[1]
    for h in range(b.q.shape[1]):
        weights = torch.softmax(k[:, h // group] @ b.q[i, h].float() * case.scale, 0)
        assert torch.allclose(kernel_check._expected_out(case)[i, h], weights @ v[:, h // group], atol=1e-5)


def test_the_chunk_rule_matches_the_contract_example():
    assert kernel_check.split_tokens(50, 4) == 16
    assert kernel_check.split_tokens(10, 4) == 16
    assert kernel_check.split_tokens(100, 2) == 64
    assert kernel_check.split_tokens(0, 2) == 0


def test_the_check_agrees_with_the_library_on_ordinary_batches():
    for case in kernel_check._cases():
        if not case.holes:
            b = case.batch
            want = paged_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, case.scale)
            assert torch.equal(kernel_check._expected_out(case), want)


# --------------------------------------------------------------------------- the launcher
@triton.jit
def _read_block_minus_one(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
                          out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
                          scale, num_blocks, max_blocks, num_q_heads,
                          stride_qs, stride_qh, stride_kb, stride_kh, stride_kt, stride_bts, stride_os, stride_oh,
                          GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                          BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr):
    col = tl.arange(0, HEAD_DIM)
    seq = tl.program_id(0)
    past_row = tl.load(block_tables_ptr + seq * stride_bts + max_blocks)  # the entry after the row's last
    before = tl.load(k_cache_ptr - stride_kb + col)  # block -1
    trap = tl.load(k_cache_ptr + past_row * stride_kb + col)
    tl.store(out_ptr + seq * stride_os + col, before + trap)
    tl.store(out_ptr + seq * stride_os + stride_oh + col, tl.load(k_cache_ptr + col))


def test_the_launcher_poisons_what_a_kernel_should_not_read():
    k = torch.randn(3, 1, 4, 16)
    q = torch.zeros(2, 2, 16)
    table = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)
    out = triton_skeleton.paged_decode(_read_block_minus_one, None, q, k, k.clone(), table,
                                       torch.tensor([5, 3], dtype=torch.int32), None, 1)
    assert bool(torch.isnan(out[:, 0]).all())  # block -1 and the trap past the row hold NaN
    assert torch.equal(out[0, 1], k[0, 0, 0])  # block 0 is the cache's own


def test_the_launcher_refuses_what_the_contract_excludes():
    q, k = torch.zeros(1, 2, 24), torch.zeros(2, 1, 4, 24)
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim 24"):
        triton_skeleton.paged_decode(None, None, q, k, k, table, lens)
    q, k = torch.zeros(1, 2, 16), torch.zeros(2, 1, 4, 16)
    with pytest.raises(ValueError, match="num_splits 3"):
        triton_skeleton.paged_decode(None, None, q, k, k, table, lens, None, 3)


# --------------------------------------------------------------------------- no answer one import away
def test_forbidden_names_the_references_and_the_notebook_imports_none():
    forbidden = forbidden_modules("09")
    for module in ["paged_kv_course.grading", "paged_kv_lib.attention.triton_kernel", "paged_kv_lib.attention.reference",
                   "paged_kv_course.grading._checks_09_kernel"]:
        assert is_forbidden(module, forbidden)
    assert not is_forbidden("paged_kv_course.triton_skeleton", forbidden)
    assert not is_forbidden("paged_kv_lib.attention.testing", forbidden)
    for cell in _cells():
        if cell["cell_type"] != "code" or cell.get("metadata", {}).get("paged_kv", {}).get("role") == "check":
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not is_forbidden(name, forbidden), (name, "".join(cell["source"])[:80])


def test_the_skeleton_holds_no_answer():
    source = Path(triton_skeleton.__file__).read_text(encoding="utf-8")
    for word in ["tl.exp", "tl.dot", "tl.maximum", "// BLOCK_SIZE", "% BLOCK_SIZE"]:
        assert word not in source


# --------------------------------------------------------------------------- the same cells compile for a GPU
_COMPILE = r'''
import importlib.util, json, pathlib, sys, tempfile
import torch
sys.path.insert(0, str(pathlib.Path(sys.argv[1]) / "benchmarks"))
from kernel_resources import _toolchain, use_standin_driver
if not _toolchain():
    print("SKIP no NVIDIA toolchain"); sys.exit(0)
use_standin_driver()
from paged_kv_course import triton_skeleton as sk
cells = json.loads(pathlib.Path(sys.argv[2]).read_text())["cells"]
src = "import math\nimport torch\nimport triton\nimport triton.language as tl\n\n" + "\n\n".join(
    "".join(c["source"]) for c in cells if c.get("metadata", {}).get("paged_kv", {}).get("task") in ("09.1", "09.2", "09.4")
    and c["metadata"]["paged_kv"]["role"] == "solution")
path = pathlib.Path(tempfile.mkdtemp()) / "sol09.py"
path.write_text(src)
spec = importlib.util.spec_from_file_location("sol09", path)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
i32, f32 = torch.empty(8, dtype=torch.int32), torch.empty(8)
sk._address_driver.warmup(i32, i32, torch.empty(8, dtype=torch.int64), torch.empty(8, dtype=torch.int8), 8, 4, 10,
                          512, 64, 16, 32, GROUP=2, BLOCK_SIZE=4, TILE=16, ADDRESSES=m.tile_addresses, grid=(1,))
sk._fold_driver.warmup(f32, f32, f32, f32, f32, 3, TILE=8, D=16, FOLD=m.fold_tile, grid=(1,))
for dt in (torch.float32, torch.bfloat16):
    q, kc = torch.empty(2, 8, 64, dtype=dt), torch.empty(8, 2, 16, 64, dtype=dt)
    for splits in (1, 4):
        m.paged_decode_kernel.warmup(q, kc, kc, i32, i32, q, f32, f32, f32, 0.1, 9, 4, 8, 512, 64, 2048, 1024, 64, 8,
                                     512, 64, GROUP=4, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_G=16, BLOCK_N=16,
                                     NUM_SPLITS=splits, grid=(1,))
    m.merge_splits_kernel.warmup(q, f32, f32, f32, 8, 512, 64, HEAD_DIM=64, NUM_SPLITS=4, grid=(1,))
print("COMPILED")
'''


def test_the_solution_kernels_compile_for_sm90():
    """No GPU needed: Triton's NVIDIA pipeline with a stand-in driver (DESIGN.md section 6)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(REPO), str(NOTEBOOK)], env=env, capture_output=True,
                          text=True, timeout=600)
    if "SKIP" in done.stdout:
        pytest.skip("Triton's NVIDIA toolchain is not installed")
    assert "COMPILED" in done.stdout, done.stderr[-3000:]


def test_a_probe_given_a_judge_proxy_reports_instead_of_launching():
    from paged_kv_course.grading import probes

    from paged_kv_course.stand_in import MARK

    class Remote:  # the judge's proxy: a learner object that stayed in the kernel, marked as grading's is
        __slots__ = ("_caller", "_key", "_kind")

    setattr(Remote, MARK, True)

    report = probes.triton_fold_tiles(Remote(), torch.zeros(1, 1, 8), torch.zeros(1, 1, 8, 16))
    assert report[0] == "raised" and "outside the learner's kernel" in report[2]
