"""The engine's contract around generation: input checks, admission rules, stats, the CLI."""

from __future__ import annotations

import pytest

from paged_kv_lib.cli import main as cli_main
from paged_kv_lib.engine import Engine, RequestTooLargeError, UnknownRequestError, UnsupportedModelError
from paged_kv_lib.errors import PagedKVError
from paged_kv_lib.model import ModelConfig, TinyTransformer, encode, generate_no_cache





@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=11).eval()


def make_engine(model, num_blocks=32, block_size=4, **options) -> Engine:
    return Engine(model, model.new_allocator(num_blocks, block_size), **options)


def test_request_that_can_never_fit_is_refused(model) -> None:
    engine = make_engine(model, num_blocks=8, block_size=4, watermark=0.0)
    with pytest.raises(RequestTooLargeError, match="pool has only 8") as info:
        engine.add_request(list(range(40)), 4)  # the prompt alone is longer than the pool
    assert info.value.needed > info.value.total == 8
    assert isinstance(info.value, ValueError)
    with pytest.raises(RequestTooLargeError):
        engine.add_request([1, 2, 3], 40)  # short prompt, but the output cannot fit
    with pytest.raises(RequestTooLargeError):
        engine.add_request(list(range(12)), 5, n=3)  # one sample fits, three cannot
    assert not engine.has_unfinished()
    # What fits exactly still runs, alone in the pool.
    engine.add_request(list(range(20)), 13)
    (out,) = engine.run(progress=False)
    assert list(out.token_ids) == generate_no_cache(model, list(range(20)), 13)


def test_watermark_counts_against_fit(model) -> None:
    engine = make_engine(model, num_blocks=10, block_size=4, watermark=0.2)
    with pytest.raises(RequestTooLargeError, match="watermark"):
        engine.add_request(list(range(30)), 4)  # 9 blocks + 2 of watermark > 10
    engine.add_request(list(range(30)), 3)  # 8 blocks + 2: fits
    assert len(engine.run(progress=False)) == 1


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda e: e.add_request([], 4), ValueError),
        (lambda e: e.add_request([1, 300], 4), ValueError),
        (lambda e: e.add_request([1, -2], 4), ValueError),
        (lambda e: e.add_request("hi", 0), ValueError),
        (lambda e: e.add_request("hi", 2.5), TypeError),
        (lambda e: e.add_request("hi", 4, n=0), ValueError),
        (lambda e: e.add_request("hi", 4, temperature=-1.0), ValueError),
        (lambda e: e.add_request("hi", 4, seed=-3), ValueError),
        (lambda e: e.add_request(b"hi", 4), TypeError),
    ],
)
def test_bad_requests_are_refused_and_change_nothing(model, call, error) -> None:
    engine = make_engine(model)
    with pytest.raises(error):
        call(engine)
    assert not engine.has_unfinished()


def test_bad_engine_options_are_refused(model) -> None:
    alloc = model.new_allocator(8, 4)
    with pytest.raises(ValueError, match="preemption_mode"):
        Engine(model, alloc, preemption_mode="evict")
    with pytest.raises(ValueError, match="watermark"):
        Engine(model, alloc, watermark=1.0)
    with pytest.raises(TypeError, match="watermark"):
        Engine(model, alloc, watermark="low")
    with pytest.raises(ValueError, match="max_batch_size"):
        Engine(model, alloc, max_batch_size=0)
    other = TinyTransformer(ModelConfig(num_layers=3))
    with pytest.raises(ValueError, match="does not fit this model"):
        Engine(other, alloc)


def test_string_prompts_are_bos_plus_bytes(model) -> None:
    engine = make_engine(model)
    engine.add_request("paging", 3)
    (out,) = engine.run(progress=False)
    assert out.prompt_ids == tuple(encode("paging"))
    assert isinstance(out.text, str) and out.texts == [out.text]


def test_admission_keeps_the_watermark_and_first_come_first_served(model) -> None:
    # 20 blocks, watermark 0.25 -> an admission must leave 5 free.
    engine = make_engine(model, num_blocks=20, block_size=4, watermark=0.25)
    big = engine.add_request(list(range(28)), 2)  # 7 blocks
    second = engine.add_request(list(range(1, 29)), 2)  # 7 more would leave 6: admitted
    third = engine.add_request(list(range(2, 22)), 2)  # 5 more would leave 1 < 5: waits
    small = engine.add_request([5, 6], 2)  # 1 block would fit, but it must not overtake
    stats = engine.step()
    assert stats.running == 2 and stats.waiting == 2
    assert [r.request_id for r in engine.running] == [big, second]
    assert [r.request_id for r in engine.queue] == [third, small]
    outputs = engine.run(progress=False)
    assert [o.request_id for o in outputs] == [big, second, third, small]
    assert engine.allocator.num_free_blocks == 20


def test_max_batch_size_caps_running_sequences(model) -> None:
    engine = make_engine(model, num_blocks=64, max_batch_size=3)
    engine.add_request("one", 6)
    engine.add_request("two", 6, n=2)
    engine.add_request("three", 6)
    most = 0
    while engine.has_unfinished():
        engine.step()
        most = max(most, engine.num_running_seqs)
    assert most == 3


def test_more_samples_than_the_batch_holds_are_refused(model) -> None:
    engine = make_engine(model, num_blocks=64, max_batch_size=2)
    with pytest.raises(ValueError, match="max_batch_size is 2"):
        engine.add_request("abc", 4, n=3)
    assert not engine.has_unfinished()


def test_step_stats_describe_the_step(model) -> None:
    engine = make_engine(model, num_blocks=32)
    engine.add_request("abcdef", 5)
    engine.add_request("abcdef", 5)
    first = engine.step()
    assert first.step == 1 and first.running == 2 and first.waiting == 0
    assert first.prefill_tokens + first.cached_tokens == 2 * len(encode("abcdef"))
    assert first.cached_tokens == 4  # the second prompt found the first's full block
    assert first.generated_tokens == 2 and first.decode_tokens == 0
    assert first.blocks_used == engine.allocator.num_used_blocks == 3
    second = engine.step()
    assert second.decode_tokens == 2 and second.prefill_tokens == 0 and second.generated_tokens == 2
    assert second.elapsed_s > 0 and second.tokens_per_s > 0
    assert set(second.as_dict()) >= {"running", "waiting", "blocks_used", "blocks_cached", "preempted", "tokens_per_s"}
    engine.run(progress=False)
    totals = engine.totals
    assert totals.generated_tokens == 10 and totals.steps == 5
    assert totals.peak_blocks_used >= 3 and totals.tokens_per_s > 0


def test_run_shows_a_progress_bar(model, capsys) -> None:
    engine = make_engine(model)
    engine.add_request("bar", 4)
    engine.run(progress=True)
    assert "generate" in capsys.readouterr().err
    engine.add_request("bar", 4)
    engine.run(progress=False)
    assert capsys.readouterr().err == ""


def test_unseeded_sampling_still_draws_different_samples(model) -> None:
    engine = make_engine(model, num_blocks=64)
    engine.add_request("hello", 12, n=4, temperature=1.5)
    (out,) = engine.run(progress=False)
    assert len({o for o in out.outputs}) > 1


def test_cli_generate_prints_text_and_stats(capsys) -> None:
    code = cli_main(
        ["generate", "A block", "The engine", "--max-new-tokens", "12", "-n", "2",
         "--temperature", "0.7", "--seed", "4", "--num-blocks", "32", "--no-progress", "--random-weights"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "[0.0] A block" in out and "[0.1] A block" in out and "[1.1] The engine" in out
    assert "generated 48 tokens" in out and "peak blocks used" in out and "tokens/s" in out


def test_cli_generate_reports_an_impossible_request(capsys) -> None:
    code = cli_main(["generate", "x", "--max-new-tokens", "500", "--num-blocks", "4", "--random-weights", "--no-progress"])
    assert code == 2
    assert "can never fit" in capsys.readouterr().err


def test_decode_step_works_on_the_whole_batch_at_once(model, monkeypatch) -> None:
    """One block-table tensor, one gather plan and no per-sequence slot mapping per step;
    one batched attention call per layer, each over the whole batch."""
    import paged_kv_lib.model.batch as model_module

    calls = {"attend": [], "plan": 0, "tables": 0, "slot_mapping": 0}
    real_attend, real_plan = model_module.attend_batched, model_module.plan_batch

    def attend(q, *args, **kwargs):
        calls["attend"].append(q.shape[0])
        return real_attend(q, *args, **kwargs)

    def plan(*args, **kwargs):
        calls["plan"] += 1
        return real_plan(*args, **kwargs)

    engine = make_engine(model, num_blocks=64)
    for prompt in ("one", "two", "three"):
        engine.add_request(prompt, 5)
    engine.step()  # prefill (extend attention)
    alloc = engine.allocator
    real_tables, real_slots = alloc.block_table_tensor, alloc.slot_mapping

    def tables(*args, **kwargs):
        calls["tables"] += 1
        return real_tables(*args, **kwargs)

    def slots(*args, **kwargs):
        calls["slot_mapping"] += 1
        return real_slots(*args, **kwargs)

    monkeypatch.setattr(model_module, "attend_batched", attend)
    monkeypatch.setattr(model_module, "plan_batch", plan)
    monkeypatch.setattr(alloc, "block_table_tensor", tables)
    monkeypatch.setattr(alloc, "slot_mapping", slots)
    engine.step()  # decode
    assert calls == {"attend": [3] * model.config.num_layers, "plan": 1, "tables": 1, "slot_mapping": 0}


# ------------------------------------------------ the engine asks the allocator (issue 17.2)
def test_decode_scheduling_obeys_the_allocators_answer(model, monkeypatch) -> None:
    """The engine keeps no copy of the growth rule: when the allocator's one call says a batch does not fit
    (``None``), the newest requests give way, whatever the engine might have computed itself."""
    engine = make_engine(model, num_blocks=64, watermark=0.0)
    for prompt in ("one", "two", "three"):
        engine.add_request(prompt, 6)
    engine.step()  # all three admitted and prefilled
    alloc = engine.allocator
    real = alloc.allocate_slots
    asked = []

    def at_most_one(seq_ids, *args, **kwargs):
        seq_ids = list(seq_ids)
        asked.append(len(seq_ids))
        return real(seq_ids, *args, **kwargs) if len(seq_ids) <= 1 else None

    monkeypatch.setattr(alloc, "allocate_slots", at_most_one)
    stats = engine.step()
    assert asked == [3, 2, 1] and stats.preempted == 2 and stats.running == 1
    monkeypatch.undo()
    outputs = engine.run(progress=False)
    for out, prompt in zip(outputs, ("one", "two", "three")):
        assert list(out.token_ids) == generate_no_cache(model, encode(prompt), 6)


def test_whether_a_request_can_ever_fit_is_the_allocators_answer(model, monkeypatch) -> None:
    engine = make_engine(model, num_blocks=16, watermark=0.1)
    asked = []

    def too_many(num_tokens, **kw):
        asked.append((num_tokens, kw))
        return 99

    monkeypatch.setattr(engine.allocator, "blocks_to_hold", too_many)
    with pytest.raises(RequestTooLargeError, match="need 99 blocks") as err:
        engine.add_request(list(range(8)), 2, n=2)  # fits by any count of ours: the allocator says no
    assert asked == [(9, {"num_seqs": 2, "watermark": 0.1})] and err.value.needed == 99
    assert not engine.has_unfinished()


def test_swapped_request_comes_back_when_the_allocator_says_it_fits(model, monkeypatch) -> None:
    alloc = model.new_allocator(6, 4, num_cpu_blocks=32)
    engine = Engine(model, alloc, watermark=0.0, preemption_mode="swap")
    first = list(range(60, 72))
    engine.add_request(first, 5)
    engine.add_request("fork", 3, n=2)
    engine.step()
    engine.step()  # the forked request is swapped out
    assert any(r.status.value == "swapped" for r in engine.queue)
    monkeypatch.setattr(alloc, "swap_in", lambda *seq_ids, **kw: None)  # never fits
    while engine.running:  # the first request finishes; the pool empties
        engine.step()
    assert [r.status.value for r in engine.queue] == ["swapped"]  # never let back in
    monkeypatch.undo()
    outputs = engine.run(progress=False)
    assert [list(o) for o in outputs[-1].outputs] == [generate_no_cache(model, encode("fork"), 3)] * 2


# ------------------------------------------------------------ engine bugs (issue 17.3)
def test_a_model_paged_attention_cannot_serve_is_refused_when_the_engine_is_built() -> None:
    small = TinyTransformer(ModelConfig(dim=32, num_heads=4, num_kv_heads=2), seed=0).eval()
    assert small.config.head_dim == 8  # the model itself accepts it (it runs without a cache)
    alloc = small.new_allocator(16, 4)
    with pytest.raises(UnsupportedModelError, match="head_dim must be from 16 to 256, got 8") as info:
        Engine(small, alloc)
    assert isinstance(info.value, ValueError)
    assert alloc.num_free_blocks == 16 and alloc.seq_ids == ()


@pytest.mark.parametrize("failing_call", [1, 2], ids=["prefill", "decode"])
def test_a_failure_inside_step_leaves_the_engine_usable(model, monkeypatch, failing_call) -> None:
    engine = make_engine(model, num_blocks=32, watermark=0.0)
    prompts = ["first prompt", "second", "a third one"]
    ids = [engine.add_request(p, 5, n=2 if i == 1 else 1) for i, p in enumerate(prompts)]
    if failing_call == 2:
        engine.step()
    real = model.forward_paged

    def boom(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(model, "forward_paged", boom)
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()
    alloc = engine.allocator
    alloc.check_invariants()
    assert alloc.seq_ids == () and alloc.num_used_blocks == 0  # every block released
    assert not engine.running and [r.request_id for r in engine.queue] == ids
    assert all(r.status.value == "waiting" for r in engine.queue)
    monkeypatch.setattr(model, "forward_paged", real)
    outputs = engine.run(progress=False)
    for out, prompt in zip(outputs, prompts):
        for sample in out.outputs:
            assert list(sample) == generate_no_cache(model, encode(prompt), 5)
    assert alloc.num_used_blocks == 0


def test_generate_checks_every_prompt_before_queueing_any(model) -> None:
    engine = make_engine(model, num_blocks=8, block_size=4, watermark=0.0)
    with pytest.raises(RequestTooLargeError):
        engine.generate(["fits", list(range(40))], 3)
    assert not engine.has_unfinished()
    with pytest.raises(ValueError):
        engine.generate(["fits", []], 3)
    assert not engine.has_unfinished()
    (out,) = engine.generate(["next"], 3)
    assert list(out.token_ids) == generate_no_cache(model, encode("next"), 3)
    assert engine.run(progress=False) == []  # nothing from the refused calls was computed


def test_generate_keeps_the_outputs_of_requests_added_before(model) -> None:
    engine = make_engine(model, num_blocks=64)
    early = engine.add_request("queued first", 12)
    (out,) = engine.generate(["then generate"], 3)
    assert list(out.token_ids) == generate_no_cache(model, encode("then generate"), 3)
    (kept,) = engine.run(progress=False)
    assert kept.request_id == early
    assert list(kept.token_ids) == generate_no_cache(model, encode("queued first"), 12)


def test_a_failed_generate_drops_only_its_own_requests(model, monkeypatch) -> None:
    engine = make_engine(model, num_blocks=64)
    early = engine.add_request("queued first", 4)
    monkeypatch.setattr(model, "forward_paged", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        engine.generate(["mine", "mine too"], 3)
    monkeypatch.undo()
    assert [r.request_id for r in engine.queue] == [early] and not engine.running
    assert engine.allocator.num_used_blocks == 0
    (kept,) = engine.run(progress=False)
    assert kept.request_id == early


def test_abort_request_releases_its_blocks(model) -> None:
    engine = make_engine(model, num_blocks=64)
    keep = engine.add_request("keep me", 4)
    drop = engine.add_request("drop me", 4, n=2)
    engine.step()
    assert engine.abort_request(drop) is True
    assert engine.abort_request(drop) is False
    used = engine.allocator.num_used_blocks
    with pytest.raises(UnknownRequestError, match="999 was never added"):
        engine.abort_request(999)
    with pytest.raises(PagedKVError):
        engine.abort_request(True)  # type: ignore[arg-type]
    assert engine.allocator.num_used_blocks == used
    engine.allocator.check_invariants()
    outputs = engine.run(progress=False)
    assert [o.request_id for o in outputs] == [keep]
    assert engine.allocator.num_used_blocks == 0


def test_a_failure_half_way_through_a_swap_out_loses_no_request(model, monkeypatch) -> None:
    alloc = model.new_allocator(6, 4, num_cpu_blocks=32)
    engine = Engine(model, alloc, watermark=0.0, preemption_mode="swap")
    first = list(range(60, 72))
    engine.add_request(first, 5)
    engine.add_request("fork", 3, n=2)
    engine.step()

    def copy_fails(device_ids, cpu_ids):  # the bookkeeping moved both samples; copying their K/V fails
        raise RuntimeError("copy to host failed")

    monkeypatch.setattr(alloc.cache, "swap_out", copy_fails)
    with pytest.raises(RuntimeError, match="copy to host"):
        engine.step()  # preempting the forked request swaps its two samples out
    monkeypatch.undo()
    alloc.check_invariants()
    assert alloc.num_used_blocks == 0 and alloc.swapped_seq_ids == ()
    assert sorted(r.request_id for r in engine.queue) == [0, 1]
    outputs = engine.run(progress=False)
    assert list(outputs[0].token_ids) == generate_no_cache(model, first, 5)
    assert [list(o) for o in outputs[1].outputs] == [generate_no_cache(model, encode("fork"), 3)] * 2
