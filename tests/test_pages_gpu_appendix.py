import json
import pathlib

import pytest

from jaxloops.pages import gpu_appendix as page

SAMPLE = pathlib.Path(__file__).parent / "data" / "gpu_results_sample.json"


def sample():
    return json.loads(SAMPLE.read_text())


def test_missing_file_means_no_recorded_run(tmp_path):
    assert page.load_results(tmp_path / "absent.json") is None
    assert "no GPU run" in page.label(None)
    assert "No GPU run is recorded" in page.sidebar(None, "mlp")


def test_goals_follow_the_roofline_of_the_measured_ceilings():
    # SAMPLE GPU has no published figures: the goals use the run's own ceilings, and say so.
    goals = page.goals(page.load_results(SAMPLE))
    fraction_goal, speedup_goal = goals[0], goals[1]
    assert "measured by this run" in fraction_goal["goal"]
    # B = 4, N = 8, T = S = 8192, H = 128; bf16 ceiling 6e14 FLOP/s, bandwidth 3e12 B/s.
    flops = 4 * 4 * 8 * 8192 * 8192 * 128
    fused_bytes = 4 * 4 * 8192 * 8 * 128 * 2  # Q, K, V read and O written, 2 bytes each
    scores_bytes = 2 * 4 * 8 * 8192 * 8192 * 2  # naive writes and reads the scores once
    cudnn = max(flops / 6e14, fused_bytes / 3e12)
    naive = max(flops / 6e14, (fused_bytes + scores_bytes) / 3e12)
    assert fraction_goal["measured"].startswith(f"{100 * cudnn / 0.003:.1f} %")
    assert fraction_goal["met"] is (cudnn / 0.003 >= 0.5)
    assert speedup_goal["measured"] == f"{0.02 / 0.003:.1f}× (predicted {naive / cudnn:.1f}×)"
    assert speedup_goal["met"] is (0.02 / 0.003 >= naive / cudnn / 2)
    assert goals[-1]["measured"] == "1 of 2 recorded passed; 06_device_loop timeout"


def test_goals_use_published_figures_for_a_listed_board():
    results = sample()
    results["facts"]["device_kind"] = "NVIDIA H200"
    fraction_goal = page.goals(results)[0]
    assert "published: NVIDIA H200 SXM" in fraction_goal["goal"]
    flops = 4 * 4 * 8 * 8192 * 8192 * 128
    assert fraction_goal["measured"].startswith(f"{100 * flops / 989.5e12 / 0.003:.1f} %")
    table = {row["ceiling"]: row for row in page.ceiling_rows(results)}
    assert table["float32 in TF32"]["of published"] == f"{100 * 3e14 / 494.5e12:.0f} %"
    assert table["memory read (bytes/s)"]["published"] == 4.8e12


def test_a_missing_row_is_reported_with_its_reason():
    results = sample()
    results["attention"] = [r for r in results["attention"] if r["implementation"] != "cudnn"]
    results["attention"].append(
        {"implementation": "cudnn", "dtype": "bfloat16", "T": 8192, "seconds": None,
         "error": "XlaRuntimeError: RESOURCE_EXHAUSTED"}
    )  # fmt: skip
    goals = page.goals(results)
    assert goals[0]["measured"] == "not measured: XlaRuntimeError: RESOURCE_EXHAUSTED"
    assert goals[0]["met"] is False and goals[1]["met"] is False


def test_sidebars_and_plot_show_the_recorded_rows(plt):
    results = page.load_results(SAMPLE)
    text = page.sidebar(results, "attention")
    assert "SAMPLE GPU (not a measurement), measured 2000-01-01" in text
    assert "RuntimeError: sample refusal" in text and "| xla | bfloat16 | 0.011 |" in text
    assert "| 128 | 9e+03 | 22 % |" in page.sidebar(results, "mlp")
    fig, ax = plt.subplots()
    page.plot_attention(results, ax)
    assert sorted(line.get_label() for line in ax.get_lines()) == [
        "cudnn bfloat16",
        "naive bfloat16",
        "xla bfloat16",
    ]
    plt.close(fig)


def test_bad_results_files_are_refused_with_what_is_wrong(tmp_path):
    results = sample()
    del results["mlp"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results))
    with pytest.raises(ValueError, match="lacks section\\(s\\) \\['mlp'\\]"):
        page.load_results(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        page.load_results(path)
    results = sample()
    results["stages"]["book"]["status"] = "finished"
    with pytest.raises(ValueError, match="stage 'book' has status 'finished'"):
        page.check_results(results)
    with pytest.raises(ValueError, match="rows_for"):
        page.sidebar(sample(), "transformer")


def test_attention_flops_and_bytes_formulas():
    shape = dict(batch=3, heads=5, length=7, head_dim=11)
    assert page.attention_flops(**shape, is_causal=False) == 4 * 3 * 5 * 7 * 7 * 11
    assert page.attention_flops(**shape, is_causal=True) == 2 * 3 * 5 * 7 * 7 * 11
    fused = page.attention_bytes(**shape, itemsize=2, materialised=False)
    assert fused == 4 * 3 * 7 * 5 * 11 * 2
    unfused = page.attention_bytes(**shape, itemsize=2, materialised=True)
    assert unfused == fused + 2 * 3 * 5 * 7 * 7 * 2


ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_default_results_path_is_the_one_the_readme_names():
    assert page.RECORDED_RESULTS == ROOT / "results" / "gpu" / "results.json"
    readme = (ROOT / "README.md").read_text()
    assert "`results/gpu/results.json`" in readme
    assert (ROOT / "results" / "gpu").is_dir()  # where results/gpu/README.md says to put it


def test_a_file_at_the_default_path_renders_in_the_appendix(tmp_path, monkeypatch):
    """The appendix loads the default path and renders its tables: placed in a copy of the
    repository's layout (results/gpu/results.json), the sample run shows in every table."""
    placed = tmp_path / "results" / "gpu" / "results.json"
    placed.parent.mkdir(parents=True)
    placed.write_text(SAMPLE.read_text())
    monkeypatch.setattr(page, "RECORDED_RESULTS", placed)
    results = page.load_results()  # the default path, as book/gpu_appendix.md calls it
    assert results == sample()
    tables = page.appendix_tables(results)
    order = ["facts", "stages", "chapters", "ceilings", "goals", "attention", "causal", "mlp"]
    assert list(tables) == [name for name in order if name != "causal" or results["causal"]]
    assert tables["chapters"].count("\n") == len(results["book_chapters"]) + 1
    assert results["facts"]["device_kind"] in tables["facts"]
    for name in ("attention", "mlp"):  # one table row per recorded row, below the header
        assert tables[name].count("\n") == len(results[name]) + 1, tables[name]
    appendix = (ROOT / "book" / "gpu_appendix.md").read_text()
    assert "page.load_results()" in appendix and "page.appendix_tables(" in appendix


def test_an_absent_default_path_renders_the_statement(tmp_path, monkeypatch):
    monkeypatch.setattr(page, "RECORDED_RESULTS", tmp_path / "results" / "gpu" / "x.json")
    assert page.load_results() is None


def test_a_gpu_run_gives_the_critical_batch_at_its_measured_and_published_rates():
    run = {
        "facts": {"device_kind": "NVIDIA H200"},
        "ceilings": [{"name": "f32", "flops_per_s": 5e13}, {"name": "bf16", "flops_per_s": 6e14}],
    }
    published, measured = page.recorded_critical_batch(run)
    assert published["critical B/n"] == f"{989.5e12 / 450e9:,.0f}" == "2,199"
    assert measured["critical B/n"] == f"{6e14 / 450e9:,.0f}" == "1,333"  # bf16's row, not f32's
    assert page.recorded_critical_batch(None) is None
    assert page.recorded_critical_batch({**run, "facts": {"device_kind": "cpu"}}) is None
    assert page.recorded_critical_batch({**run, "ceilings": run["ceilings"][:1]}) is None


def test_chapter_5s_note_sets_the_compiled_count_beside_the_lowered_one():
    run = {"facts": {"device_kind": "NVIDIA H200"}, "mlp": [
        {"batch_size": 512, "flops_per_step": 3.4e9, "compiled_flops_per_step_on_gpu": 1.27e9},
        {"batch_size": 32768, "flops_per_step": 217.1e9, "compiled_flops_per_step_on_gpu": 11.07e9},
    ]}  # fmt: skip
    assert page.compiled_flops_note(run) == (
        "the recorded NVIDIA H200 run's compiled count of chapter 6's MLP step at batch 32,768 "
        "was 11.1 GFLOP; the lowered count is 217 GFLOP"
    )
    uncorrected = {"facts": run["facts"], "mlp": [{"batch_size": 8, "flops_per_step": 1.0}]}
    for results in (None, uncorrected):
        assert page.compiled_flops_note(results).startswith("no GPU run is recorded")
