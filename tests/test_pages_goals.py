import json

import pytest

from jaxloops.pages import goals


def test_the_goals_are_the_values_the_issues_set():
    asked = {g.key: (g.asked, g.at_least) for g in goals.GOALS}
    assert asked == {
        "validation_hook": (0.85, True),
        "causal_over_full": (1.4, True),
        "step_of_ceiling": (0.55, True),
        "gradient_over_forward": (3.3, False),
        "step_over_pytorch": (1.0, True),
        "fit_of_bare_epoch": (0.95, True),  # issue 43, on the chip
        "fit_over_python_loop": (8.0, True),
        "decode_gqa_of_roofline": (0.70, True),
        "step_bf16_of_ceiling": (0.60, True),
        "pallas_forward_h128": (0.80, True),
        "pallas_forward_h64": (0.60, True),
        "pallas_causal_of_ideal": (0.85, True),
        "pallas_causal_speedup": (1.8, True),
        "pallas_forward_backward_h128": (0.45, True),
        "pallas_over_library": (1.0, True),
    }
    tpu = {"fit_of_bare_epoch", "fit_over_python_loop", "decode_gqa_of_roofline"}
    tpu |= {"step_bf16_of_ceiling"}
    assert {g.key for g in goals.GOALS if g.backend == "tpu"} == tpu | {
        k for k in asked if k.startswith("pallas")
    }


def test_a_goal_is_met_or_missed_by_how_much_in_either_direction():
    at_least, at_most = goals.goal("causal_over_full"), goals.goal("gradient_over_forward")
    assert at_least.met(1.4) and not at_least.met(1.39) and not at_least.met(float("nan"))
    assert goals.verdict(at_least, 1.28, "cpu") == "missed by 0.120 (1.280)"
    assert goals.verdict(at_least, 1.52, "cpu") == "met (1.520)"
    assert at_most.met(3.3) and not at_most.met(3.304)
    assert goals.verdict(at_most, 3.304, "cpu") == "missed by 0.004 (3.304)"
    share = goals.goal("step_of_ceiling")
    assert share.stated == "≥ 55 %" and at_most.stated == "≤ 3.3"
    assert goals.verdict(share, 0.546, "cpu") == "missed by 0.4% (54.6%)"
    with pytest.raises(ValueError, match="no goal 'speed'"):
        goals.goal("speed")


def test_a_page_states_the_goal_as_set_and_a_miss_visibly():
    g = goals.goal("causal_over_full")
    assert goals.page_sentence(g, 1.28, "cpu") == (
        "The goal is ≥ 1.4; this build measured 1.280: missed, by 0.120."
    )
    assert goals.page_sentence(g, 1.5, "cpu").endswith("met.")
    off = goals.page_sentence(g, 1.1, "tpu")
    assert "not applicable here" in off and "tpu" in off and "measured 1.100" in off


def test_the_bench_record_fails_only_where_a_goal_applies(tmp_path):
    measured = {"causal_over_full": 1.2, "validation_hook": 0.9}
    record = goals.bench_record(measured, "cpu", {"device": "test"})
    assert goals.missed(record) == ["causal_over_full"]
    assert record["goals"]["step_of_ceiling"]["verdict"] == "not measured"
    on_tpu = goals.bench_record(measured, "tpu", {"device": "test"})
    assert goals.missed(on_tpu) == []
    path = goals.write_record(record, "cpu-test-2cores", tmp_path)
    assert goals.recorded(tmp_path) == {"cpu-test-2cores": json.loads(path.read_text())}
    with pytest.raises(ValueError, match=r"measured values for no goal: \['speed'\]"):
        goals.bench_record({"speed": 1.0}, "cpu", {})


def test_a_tpu_goal_applies_on_a_tpu_only():
    g = goals.goal("pallas_forward_h128")
    assert goals.verdict(g, 0.82, "tpu") == "met (82.0%)"
    assert goals.verdict(g, 0.78, "tpu") == "missed by 2.0% (78.0%)"
    off = goals.verdict(g, 0.82, "cpu")
    assert off.startswith("not applicable here") and "TPU v5e" in off
    on_tpu = goals.bench_record({"pallas_forward_h128": 0.5}, "tpu", {})
    assert goals.missed(on_tpu) == ["pallas_forward_h128"]
    assert goals.missed(goals.bench_record({"pallas_forward_h128": 0.5}, "cpu", {})) == []
    # A CPU goal is still not applicable on a TPU.
    assert goals.not_applicable("tpu", goals.goal("causal_over_full")).startswith("set for XLA")


def test_chapters_leave_their_values_for_build_info(tmp_path):
    goals.note_measured("validation_hook", 0.8, tmp_path)
    assert goals.measured_in_build(tmp_path) == {"validation_hook": 0.8}
    with pytest.raises(ValueError, match="no goal 'hook'"):
        goals.note_measured("hook", 0.8, tmp_path)
    table = goals.goals_table({"validation_hook": 0.8}, "cpu", {"cpu-x-2cores": goals.bench_record(
        {"validation_hook": 0.9}, "cpu", {})})  # fmt: skip
    lines = table.splitlines()
    assert len(lines) == 2 + len(goals.GOALS)
    assert "missed by 5.0% (80.0%)" in lines[2] and "met (90.0%)" in lines[2]
    assert "not measured" in lines[3] and "not recorded" not in table


def test_machine_keys_are_file_names():
    key = goals.machine_key("cpu", "cpu", "AMD EPYC 7B13 64-Core Processor", 2)
    assert key == "cpu-amd-epyc-7b13-64-core-processor-2cores"
    assert goals.machine_key("tpu", "TPU v5 lite", "", 13) == "tpu-tpu-v5-lite-13cores"


def test_a_device_run_s_goal_values_reach_the_table_with_their_verdict(tmp_path):
    """The values a recorded device run's chapters left, judged for that run's backend: a TPU
    goal missed there says so; a CPU goal is not applicable to it."""
    (tmp_path / "tpu").mkdir()
    run = {"device": "TPU v5 lite", "backend": "tpu", "chapters": {
        "07": {"date": "2026-12-06", "goals": {"fit_of_bare_epoch": 0.9, "validation_hook": 0.9}},
        "11": {"date": "2026-12-05", "goals": {"step_bf16_of_ceiling": 0.61}},
        "12": {"date": "2026-12-05"}}}  # fmt: skip
    (tmp_path / "tpu" / "run.json").write_text(json.dumps(run))
    devices = goals.device_measured(tmp_path)
    assert devices["tpu"]["values"] == {
        "fit_of_bare_epoch": 0.9,
        "validation_hook": 0.9,
        "step_bf16_of_ceiling": 0.61,
    }
    table = goals.goals_table({}, "cpu", {}, devices)
    assert "device run on TPU v5 lite (tpu)" in table.splitlines()[0]
    row = lambda key: next(line for line in table.splitlines() if goals.goal(key).what in line)
    assert row("fit_of_bare_epoch").endswith("missed by 5.0% (90.0%), 2026-12-06 |")
    assert row("step_bf16_of_ceiling").endswith("met (61.0%), 2026-12-05 |")
    assert row("validation_hook").endswith("not applicable (90.0%), 2026-12-06 |")
    assert row("decode_gqa_of_roofline").endswith("not recorded |")
