"""scripts/gpu_benchmarks.py: the stages' measurements, and a crash that loses only its own."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_benchmarks as bench  # noqa: E402 - scripts/ is put on the path just above
import gpu_points  # noqa: E402


def test_the_first_stage_measures_in_the_order_of_their_value():
    plan = bench.make_plan(rehearse=True)
    first = bench.tasks(plan, "headline")
    assert first[:5] == ["implementations", "ceiling f32", "ceiling tf32", "ceiling bf16",
                         "bandwidth"]  # fmt: skip
    assert first[-3:] == [f"mlp {b}" for b in plan.mlp_batch_sizes][-1:] + ["lm", "memory"]
    goal = plan.goal_length
    assert [t for t in first if t.endswith(f" bfloat16 {goal}")] == [
        f"attention {n} bfloat16 {goal}" for n in ("cudnn", "naive", "xla")
    ]


def test_the_two_stages_measure_every_point_once():
    plan = bench.make_plan(rehearse=True)
    everything = bench.tasks(plan, "headline") + bench.tasks(plan, "sweeps")
    assert len(everything) == len(set(everything))
    attention = {t for t in everything if t.startswith("attention ")}
    requests = {("cudnn", "bfloat16"), *bench.REST_REQUESTS}
    assert attention == {f"attention {n} {d} {t}" for n, d in requests for t in plan.lengths}


def test_model_flops_count_6_per_weight_per_token_plus_the_attention_scores():
    params = {"embed": {"tokens": np.zeros((13, 7))}, "block_0": {"w": np.zeros((7, 11))}}
    B, T, L, D = 3, 5, 1, 7
    flops = gpu_points.lm_model_flops(params, B, T, L, D)
    assert flops == 6 * 77 * B * T + 12 * L * T * D * B * T  # the embedding table is not counted


def test_a_crash_in_one_measurement_loses_only_that_one(tmp_path):
    path = os.pathsep.join(filter(None, [str(ROOT / "code"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, bench.CRASH_AT: "ceiling f32", "PYTHONPATH": path}
    only = "ceiling f32,ceiling bf16"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_benchmarks.py"), "headline", "--rehearse",
         "--out", str(tmp_path), "--only", only],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert [row["name"] for row in results["ceilings"]] == ["bf16"]
    assert results["ceilings"][0]["flops_per_s"] > 0
    assert results["tasks"] == {
        "ceiling f32": "crashed: the child process died of SIGABRT",
        "ceiling bf16": "done",
    }
    assert results["failures"] == [
        {"where": "ceiling f32", "error": "the child process died of SIGABRT"}
    ]
    assert results["in_flight"] is None and results["facts"]["rehearsal"] is True
    assert jax.default_backend() == results["facts"]["backend"]


def test_the_gpu_points_are_measured_by_the_chapters_code_and_rule():
    import statistics
    import types

    plan = bench.make_plan(rehearse=True)
    failures = []
    run = types.SimpleNamespace(plan=plan, fail=lambda where, e: failures.append(where) or str(e))
    row = gpu_points.attention_point(run, "naive", "float32", plan.goal_length)
    assert row["error"] == "" and row["precision"] == "highest" and row["flops"] > 0
    n = row["calls_per_sample"]  # samples several calls long, reported per call
    assert n >= 2 and n & (n - 1) == 0 and len(row["samples"]) == plan.samples
    assert row["seconds"] == statistics.median(row["samples"])
    assert row["shortest_sample_seconds"] == min(row["samples"]) * n
    longer = gpu_points.attention_point(run, "naive", "bfloat16", max(plan.lengths))
    assert longer["seconds"] is None and longer["error"].startswith("not run: needs")
    causal = gpu_points.causal_point(run, "xla", plan.goal_length)
    assert causal["error"] == "" and causal["speedup_low"] <= causal["speedup"]
    assert causal["speedup"] <= causal["speedup_high"]  # the median of paired ratios
    assert failures == []
