import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from jaxloops import measure


def test_count_compiles_counts_exactly_the_compilations_of_a_fresh_function():
    @jax.jit
    def scaled(x):
        return 3.0 * x + 1.0

    with measure.count_compiles() as log:
        scaled(jnp.ones(3))
        scaled(jnp.ones(3))  # same signature: reused
        scaled(jnp.ones(5))  # new shape
        scaled(jnp.ones(5, jnp.int32))  # new dtype
    assert log.names.count("jit(scaled)") == 3
    assert len(log.seconds) == log.count
    assert log.seconds_of("jit(scaled)") > 0
    with measure.count_compiles() as again:
        scaled(jnp.ones(3))
    assert again.count == 0


def test_time_call_waits_for_the_result_and_returns_a_positive_median():
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    seconds = measure.time_call(fn, jnp.ones(3), warmup=2, repeats=5)
    assert seconds > 0 and len(calls) == 7
    dispatch = measure.time_dispatch(fn, jnp.ones(3), warmup=1, repeats=3)
    assert dispatch > 0 and len(calls) == 11
    with pytest.raises(ValueError, match="repeats"):
        measure.time_call(fn, jnp.ones(3), repeats=0)


def test_interleaved_seconds_runs_every_run_each_round_and_keeps_the_median(monkeypatch):
    counts = {"a": 0, "b": 0}
    sleeps = {"a": iter([0.0, 0.04, 0.002, 0.004]), "b": iter([0.0, 0.001, 0.001, 0.001])}
    clock = [0.0]  # a clock that only the runs advance: exact on a busy machine
    monkeypatch.setattr(measure.timing.time, "perf_counter", lambda: clock[0])

    def make(name):
        def run():
            counts[name] += 1
            clock[0] += next(sleeps[name])
            return jnp.ones(2)

        return run

    median = measure.interleaved_seconds({"a": make("a"), "b": make("b")}, rounds=3)
    assert counts == {"a": 4, "b": 4}  # one warm-up and three timed calls each
    # a: samples of 40, 2 and 4 ms; the median is the 4 ms one, not the fastest nor the mean.
    assert median == pytest.approx({"a": 0.004, "b": 0.001}, abs=1e-12)
    with pytest.raises(ValueError, match="rounds"):
        measure.interleaved_seconds({"a": make("a")}, rounds=0)


def test_a_call_too_short_to_time_alone_is_sampled_several_at_a_time_and_reported_per_call(
    monkeypatch,
):
    from jaxloops.measure import sweeps

    clock = [0.0]  # only the calls advance it: 0.1 ms each
    monkeypatch.setattr(measure.timing.time, "perf_counter", lambda: clock[0])
    calls = []

    def call():
        calls.append(1)
        clock[0] += 1e-4
        return len(calls)

    assert measure.timing.queued(call, 3)() == 3  # three calls, the last one's result
    # Doubling: 8 calls last 0.8 ms, 16 last 1.6 ms >= 1 ms; then once more: 32.
    assert measure.timing.calls_per_sample(call, 1e-3) == 32
    assert measure.timing.calls_per_sample(call, 1e-3, max_calls=8) == 8
    # A sweep's samples of 32 calls are reported per call: 0.1 ms, not 3.2 ms.
    row = {}
    sweeps._time_points([(row, call)], 3, min_sample_seconds=1e-3)
    assert row["calls_per_sample"] == 32 and row["seconds"] == pytest.approx(1e-4)
    assert row["samples"] == pytest.approx([1e-4] * 3)
    sweeps._time_points([(row, call)], 2, min_sample_seconds=None)  # one call a sample
    assert row["calls_per_sample"] == 1 and row["samples"] == pytest.approx([1e-4] * 2)
    with pytest.raises(ValueError, match="calls >= 1"):
        measure.timing.queued(call, 0)
    with pytest.raises(ValueError, match="min_seconds > 0"):
        measure.timing.calls_per_sample(call, 0.0)


def test_interleaved_samples_takes_turns_each_timed_call_after_an_untimed_one():
    log = []

    def make(name, seconds):
        def run():
            log.append(name)
            time.sleep(seconds)
            return jnp.ones(2)

        return run

    samples = measure.interleaved_samples({"a": make("a", 0.0), "b": make("b", 0.02)}, rounds=3)
    # Compile calls, then each round: an untimed and a timed call of a, then of b.
    assert log == ["a", "b"] + ["a", "a", "b", "b"] * 3
    assert [len(s) for s in samples.values()] == [3, 3]
    assert min(samples["b"]) >= 0.02 > max(samples["a"])  # each sample is its own run's call
    log.clear()
    measure.interleaved_samples({"a": make("a", 0.0)}, rounds=2, warmup_each=0)
    assert log == ["a"] * 3
    with pytest.raises(ValueError, match="warmup_each"):
        measure.interleaved_samples({"a": make("a", 0.0)}, rounds=1, warmup_each=-1)


def test_allocated_bytes_counts_the_buffers():
    # Device buffers put there from NumPy: no program compiled to fill them.
    tree = jax.device_put({"a": np.ones((3, 5), np.float32), "b": np.ones((7,), np.int32)})
    assert measure.allocated_bytes(tree) >= 15 * 4 + 7 * 4


def test_a_fresh_process_writes_the_persistent_cache(tmp_path):
    loop = jaxloops.experiment_sizes("cpu").loop  # a test-sized network: 5 and 3 hidden units
    seconds = measure.compile_in_fresh_process(tmp_path, dataclasses.replace(loop, hidden=(5, 3)))
    assert seconds > 0
    assert any(tmp_path.iterdir())  # the compiled programs were stored for the next process


def test_a_host_callback_program_asks_the_cache_and_is_never_stored(tmp_path):
    first = measure.callback_cache_counts(tmp_path)
    second = measure.callback_cache_counts(tmp_path)
    # The control: the plain program is stored, then loaded by the next process.
    assert first["plain"] == {"requests": 1, "hits": 0, "writes": 1}
    assert second["plain"] == {"requests": 1, "hits": 1, "writes": 0}
    # The callback program asks the cache in both processes (what chapter 1 corrects).
    assert first["callback"]["requests"] == second["callback"]["requests"] == 1
    never_stored = ({"requests": 1, "hits": 0, "writes": 0},) * 2
    stored_then_loaded = (
        {"requests": 1, "hits": 0, "writes": 1},
        {"requests": 1, "hits": 1, "writes": 0},
    )
    assert (first["callback"], second["callback"]) in (never_stored, stored_then_loaded)
    # The pinned JAX, which the book is built with, declines to store it, as chapter 1 says;
    # JAX 0.12 (CI's newest-releases run, 2026-12-06) stores it and loads it in the next process.
    if jax.__version__ == "0.10.2":
        assert (first["callback"], second["callback"]) == never_stored


def test_the_suite_cache_report_sums_the_processes_and_counts_the_entries(tmp_path):
    reports, cache = tmp_path / "report", tmp_path / "cache"
    assert measure.suite_cache_report(reports, cache) is None  # no test run: nothing to say
    reports.mkdir()
    cache.mkdir()
    (reports / "gw0.json").write_text('{"requests": 7, "hits": 2, "writes": 5}')
    (reports / "gw1.json").write_text('{"requests": 3, "hits": 3, "writes": 0}')
    for name in ("jit_f-1a-cache", "jit_f-1a-atime", "jit_g-2b-cache"):
        (cache / name).write_text("")
    report = measure.suite_cache_report(reports, cache)
    assert report == {"requests": 10, "hits": 5, "writes": 5, "processes": 2, "entries": 2}
    (reports / "gw2.json").write_text('{"requests": 1}')
    with pytest.raises(ValueError, match="gw2.json"):
        measure.suite_cache_report(reports, cache)


def test_paired_ratio_divides_out_a_slow_round():
    samples = {"a": [2.0, 20.0, 2.2], "b": [1.0, 10.0, 2.0]}  # round 2: the machine was slow
    assert measure.paired_ratio(samples["a"], samples["b"]) == 2.0  # per round 2, 2 and 1.1
    assert measure.paired_ratio(samples["b"], samples["a"]) == 0.5
    # The ratio of medians (2.2 / 2.0 = 1.1) is what the pairing avoids: a wrong statistic fails.
    assert measure.paired_ratio(samples["a"], samples["b"]) != 2.2 / 2.0
    with pytest.raises(ValueError, match="same length"):
        measure.paired_ratio([1.0], [])
    # The median with the least and the most round beside it
    assert measure.paired_spread(samples["a"], samples["b"]) == pytest.approx((2.0, 1.1, 2.0))
    with pytest.raises(ValueError, match="same length"):
        measure.paired_spread([1.0], [])


def test_a_claim_of_faster_needs_the_wins_a_coin_reaches_less_than_once_in_100():
    # The sign test's thresholds: all 7 of 7, all 10 of 10, 13 of 15, 16 of 20.
    assert [measure.rounds_needed(n) for n in (7, 10, 15, 20)] == [7, 10, 13, 16]
    slow = [2.0] * 15
    fast = [1.0] * 13 + [2.5, 3.0]  # two disturbed rounds lost
    assert measure.faster_rounds(fast, slow) == (13, 13)  # holds
    assert measure.paired_wins(fast, slow) == 13 and measure.paired_wins(slow, fast) == 2
    # Known-wrong: a program that won 12 rounds of 15 is not shown faster, though its median
    # ratio (0.5) and most rounds say so; nor is one no faster at all.
    assert measure.faster_rounds([1.0] * 12 + [3.0] * 3, slow) == (12, 13)
    assert measure.faster_rounds(slow, slow)[0] == 0
    assert measure.worst_paired_ratio(fast, slow) == 1.5
    with pytest.raises(ValueError, match="6 paired rounds cannot show"):
        measure.rounds_needed(6)
    with pytest.raises(ValueError, match="same length"):
        measure.faster_rounds([1.0], [])
