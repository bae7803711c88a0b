"""``paged-kv simulate``: table, JSON, plots, sweeps and errors."""

import argparse
import json

import pytest

from paged_kv_lib.simulate import cli as sim_cli
from paged_kv_lib.simulate import make_workload, simulate


def run_cli(*argv):
    parser = argparse.ArgumentParser(prog="paged-kv")
    sim_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", *argv])
    return args.func(args)


def test_json_object_has_the_documented_shape(capsys):
    assert run_cli("--workload", "alpaca", "--requests", "150", "--capacity-tokens", "4000",
                   "--seed", "3", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"] == "alpaca" and data["capacity_tokens"] == 4000 and data["requests"] == 150
    rows = data["results"]
    assert [r["allocator"] for r in rows] == ["orca-max", "orca-pow2", "orca-oracle", "paged"]
    assert [r["block_size"] for r in rows] == [None, None, None, 16]
    for row in rows:
        parts = [row[k] for k in ("token_states", "reserved", "internal", "external", "free")]
        assert all(0 <= p <= 1 for p in parts) and sum(parts) == pytest.approx(1.0)
        assert row["finished"] == 150 and row["mean_batch"] > 0 and row["preemptions"] >= 0
    # The CLI reports exactly what the Python API computes.
    api = simulate(make_workload("alpaca", 150, 3), 4000)
    assert [r.as_dict()["token_states"] for r in api] == [r["token_states"] for r in rows]


def test_table_has_one_row_per_allocator_and_block_size(capsys):
    assert run_cli("--requests", "60", "--block-size", "4,16,64", "--allocators", "orca-oracle,paged") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:2] == ["allocator", "tokens"]
    rows = [line for line in out[2:] if not line.startswith("note:")]
    names = [line.split()[0] + (" " + line.split()[1] if line.startswith("paged") else "") for line in rows]
    assert names == ["orca-oracle", "paged B=4", "paged B=16", "paged B=64"]
    # 60 requests do not load a paged cache with small blocks: the table says so.
    assert any(line.startswith("note: paged B=4 never had a request waiting") for line in out)


def test_plot_is_written(tmp_path, capsys):
    path = tmp_path / "waste.png"
    assert run_cli("--requests", "40", "--block-size", "8,16", "--plot", str(path), "--json") == 0
    assert json.loads(capsys.readouterr().out)["results"]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_file_workload(tmp_path, capsys):
    path = tmp_path / "mine.csv"
    path.write_text("prompt_len,output_len\n" + "".join(f"{10 + i},{20 + i}\n" for i in range(30)))
    assert run_cli("--workload", str(path), "--capacity-tokens", "3000", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"] == "mine" and data["requests"] == 30


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--workload", "nosuch"], "neither sharegpt nor alpaca nor a file"),
        (["--workload", "missing.csv"], "does not exist"),
        (["--block-size", "16,x"], "--block-size takes integers"),
        (["--block-size", "0"], "block_size must be >= 1"),
        (["--allocators", "orca-max,vllm"], "unknown allocator 'vllm'"),
        (["--capacity-tokens", "1000"], "more than the 1000 usable slots"),
        (["--requests", "0"], "num_requests must be >= 1"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(capsys, argv, fragment):
    full = argv if "--requests" in argv else ["--requests", "5", *argv]
    assert run_cli(*full) == 2
    assert fragment in capsys.readouterr().err


def test_progress_bar_only_on_a_terminal(monkeypatch):
    workload = make_workload("alpaca", 10, 0)
    args = argparse.Namespace(json=False, no_progress=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    assert sim_cli._progress(args, workload, ["paged"], [16]) is None
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    bar = sim_cli._progress(args, workload, ["orca-max", "paged"], [8, 16])
    assert bar is not None and bar.total == 30
    bar.close()
    assert sim_cli._progress(argparse.Namespace(json=True, no_progress=False), workload, ["paged"], [16]) is None


def test_registered_in_the_paged_kv_command(capsys):
    from paged_kv_lib.cli import main

    assert main(["simulate", "--requests", "20", "--allocators", "paged", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["allocator"] == "paged"


# ---------------------------------------------------------------------------------------
# Sizes, plot paths and allocator lists are refused in one line, before any work


def test_an_empty_allocator_list_is_an_error(capsys):
    assert run_cli("--requests", "10", "--allocators", "") == 2
    err = capsys.readouterr().err.strip()
    assert "--allocators names no allocator" in err and len(err.splitlines()) == 1


def test_a_size_the_machine_cannot_hold_is_refused_before_allocating(capsys):
    import time

    start = time.monotonic()
    assert run_cli("--capacity-tokens", str(10 ** 13), "--block-size", "1", "--requests", "10") == 2
    err = capsys.readouterr().err.strip()
    assert time.monotonic() - start < 2, "refused from an estimate, not after allocating"
    assert "needs about" in err and "ask for less" in err and len(err.splitlines()) == 1, err
    assert run_cli("--requests", str(10 ** 9), "--allocators", "paged") == 2
    assert "needs about" in capsys.readouterr().err


@pytest.mark.parametrize("plot, message", [
    ("/nonexistent-folder/waste.png", "no folder"),
    ("waste.txt", "give a file ending in"),
    (".", "give a file ending in"),
])
def test_plot_path_errors_are_one_line(tmp_path, capsys, plot, message):
    assert run_cli("--requests", "20", "--plot", plot) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_the_memory_estimate_matches_the_measured_simulation_state():
    """The per-block and per-request constants are upper bounds of what the simulation holds."""
    import tracemalloc

    from paged_kv_lib.allocator import PagedKVCacheAllocator

    tracemalloc.start()
    PagedKVCacheAllocator(20000, 1, 1, 1, allocate_cache=False)
    per_block = tracemalloc.get_traced_memory()[1] / 20000
    tracemalloc.reset_peak()
    make_workload("sharegpt", 2000, 0)
    per_request = tracemalloc.get_traced_memory()[1] / 2000
    tracemalloc.stop()
    assert per_block < sim_cli.BYTES_PER_BLOCK and per_request < sim_cli.BYTES_PER_REQUEST


def test_ensure_fits_names_the_need_and_the_limit():
    from paged_kv_lib.memcheck import TooLargeError, ensure_fits, human

    ensure_fits(100, "x", available=1000)
    with pytest.raises(TooLargeError, match=r"x needs about 1000.0 KiB, more than the 800.0 KiB"):
        ensure_fits(1024 * 1000, "x", available=1024 * 1000)
    assert human(1536) == "1.5 KiB" and human(3) == "3 B"
