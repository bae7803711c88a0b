"""Compile the attention kernels for an H100/H200 (sm_90) without a GPU; report registers and spills.

    python benchmarks/kernel_resources.py [--quick] [--json FILE]

Triton's NVIDIA pipeline (TTIR -> TTGIR -> PTX -> ptxas) needs no GPU once the active
driver names a CUDA target, so this swaps in a stand-in driver that reports
``GPUTarget("cuda", 90, 32)``, builds each launch exactly as the launchers do (from
placeholder CPU tensors of the right dtypes and shapes, via ``plan_decode`` and
``plan_extend``), compiles it with ``kernel.warmup`` and reads the cubin's resource usage
with the ``cuobjdump`` shipped in Triton's NVIDIA backend. Nothing is launched.

Exit status: 0 no kernel spills; 1 a kernel spills registers (a stack frame in its
cubin); 77 the compiler cannot run here (no NVIDIA backend, ptxas or cuobjdump, or a
Triton whose driver API differs), so a test can skip.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Dict, List, Optional

# The real compiler, not the interpreter: set before Triton is first imported.
os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SKIP = 77
SM90 = 90


def _toolchain() -> Optional[str]:
    """Path of cuobjdump if Triton's NVIDIA backend (ptxas included) is usable, else None."""
    try:
        from triton import knobs

        if knobs.nvidia.ptxas is None:
            return None
        return knobs.nvidia.cuobjdump.path
    except Exception:  # no NVIDIA backend, or a tool missing from it
        return None


def use_standin_driver() -> None:
    """Make Triton compile for sm_90 on a machine with no GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class StandInDriver:
        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", SM90, 32)

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: Optional[int] = None) -> int:
            return 0

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

    driver.set_active(StandInDriver())


def resource_usage(cubin: bytes, cuobjdump: str) -> Dict[str, int]:
    """Registers, stack and shared memory per the cubin's ``cuobjdump -res-usage`` line."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return {key.lower(): int(value) for key, value in found.items()}


def _placeholders(dtype: torch.dtype, num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int, tokens: int) -> dict:
    """CPU tensors with the launch's dtypes and strides; their contents are never read."""
    return dict(
        q=torch.empty(tokens, num_q_heads, head_dim, dtype=dtype),
        k_cache=torch.empty(8, num_kv_heads, block_size, head_dim, dtype=dtype),
        v_cache=torch.empty(8, num_kv_heads, block_size, head_dim, dtype=dtype),
        block_tables=torch.empty(2, 4, dtype=torch.int32),
        seq_lens=torch.empty(2, dtype=torch.int32),
    )


def decode_cases(quick: bool) -> List[dict]:
    """Decode shapes to compile; ``quick`` keeps the ones nearest a spill (wide heads, fp32)."""
    if quick:
        cases = [dict(dtype="bfloat16", head_dim=d, group=8, num_splits=1) for d in (64, 128, 256)]
        cases += [dict(dtype="float32", head_dim=d, group=1, num_splits=1) for d in (128, 256)]
        cases.append(dict(dtype="bfloat16", head_dim=128, group=4, num_splits=4))
    else:
        cases = [
            dict(dtype=dtype, head_dim=d, group=g, num_splits=n)
            for dtype in ("bfloat16", "float16", "float32")
            for d in (64, 128, 256)
            for g in (1, 4, 8)
            for n in (1, 4)
        ]
    # The merge at the largest split count a caller may ask for (cut by max_merge_splits).
    cases += [dict(dtype="bfloat16", head_dim=d, group=1, num_splits=256) for d in ((64, 256) if quick else (64, 128, 256))]
    return [dict(c, kind="decode") for c in cases]


def extend_cases(quick: bool) -> List[dict]:
    """Extend shapes to compile; ``quick`` keeps wide heads and every fp32 tile rule."""
    if quick:
        shapes = [("bfloat16", 128, 4), ("bfloat16", 256, 1), ("float32", 64, 1), ("float32", 128, 8), ("float32", 256, 8)]
    else:
        shapes = [(t, d, g) for t in ("bfloat16", "float16", "float32") for d in (64, 96, 128, 256) for g in (1, 4, 8)]
    return [dict(kind="extend", dtype=t, head_dim=d, group=g) for t, d, g in shapes]


# fp32 decode at head_dim 256 with 4 warps spilled about 6 KB a thread: compiled as a
# control, it shows the spill detection works (the default there is 8 warps).
SPILLING_CONTROL = dict(kind="decode", dtype="float32", head_dim=256, group=1, num_splits=1, num_warps=4)


def compile_case(case: dict, cuobjdump: str) -> List[dict]:
    """Compile one case's launches; one row per kernel with its resource usage."""
    from paged_kv_lib.attention import triton_kernel as tk

    dtype = getattr(torch, case["dtype"])
    num_kv_heads = 2
    t = _placeholders(dtype, num_kv_heads * case["group"], num_kv_heads, case["head_dim"], 16, tokens=2)
    out = torch.empty_like(t["q"])
    if case["kind"] == "decode":
        launches = tk.plan_decode(
            t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], 0.1, out,
            num_splits=case["num_splits"], num_warps=case.get("num_warps"),
        )
    else:
        qsl = torch.empty(3, dtype=torch.int32)
        launches = [
            tk.plan_extend(
                t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], qsl, 0.1, out,
                max_query_len=1024, num_warps=case.get("num_warps"),
            )
        ]
    rows = []
    for launch in launches:
        compiled = launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.options)
        usage = resource_usage(compiled.asm["cubin"], cuobjdump)
        settings = {k: v for k, v in launch.options.items() if k.startswith("BLOCK") or k in ("num_warps", "num_stages", "NUM_SPLITS")}
        rows.append(dict(case, kernel=launch.kernel.fn.__name__, settings=settings, **usage))
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes (what the test compiles)")
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    args = parser.parse_args(argv)

    cuobjdump = _toolchain()
    if cuobjdump is None:
        print("kernel-resources: SKIP: Triton's NVIDIA compiler (ptxas, cuobjdump) is not available here")
        return SKIP
    try:
        use_standin_driver()
    except Exception as exc:  # a Triton whose driver API differs
        print(f"kernel-resources: SKIP: cannot install a stand-in sm_90 driver ({type(exc).__name__}: {exc})")
        return SKIP

    rows: List[dict] = []
    # Every launch passes its options explicitly (enable_fp_fusion included), so Triton
    # must not warn: a warning here is an error.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        control = compile_case(SPILLING_CONTROL, cuobjdump)[0]
        if not control.get("stack"):
            print(f"kernel-resources: FAILED: the control setting known to spill shows no stack: {control}")
            return 1
        print(f"control (known to spill): {control['reg']} registers, stack {control['stack']} B")
        for case in decode_cases(args.quick) + extend_cases(args.quick):
            for row in compile_case(case, cuobjdump):
                rows.append(row)
                print(
                    f"{row['kernel']:<22} {row['dtype']:<9} d={row['head_dim']:<3} group={row['group']:<2} "
                    f"{json.dumps(row['settings'])}: {row.get('reg')} registers, stack {row.get('stack')} B, "
                    f"shared {row.get('shared')} B",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    spills = [r for r in rows if r.get("stack", 0) or r.get("local", 0)]
    for r in spills:
        print(f"SPILL: {r['kernel']} {r['dtype']} head_dim {r['head_dim']} group {r['group']} "
              f"{json.dumps(r['settings'])}: stack {r.get('stack')} B")
    print(f"kernel-resources: {len(rows)} kernels compiled for sm_{SM90}, {len(spills)} spill registers")
    return 1 if spills else 0


if __name__ == "__main__":
    sys.exit(main())
