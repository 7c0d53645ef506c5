import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from jaxloops.measure import gpu_report  # noqa: E402

SAMPLE = pathlib.Path(__file__).parent / "data" / "gpu_results_sample.json"


def test_missing_file_means_no_recorded_run(tmp_path):
    assert gpu_report.load_results(tmp_path / "absent.json") is None
    assert "no GPU run" in gpu_report.label(None)
    assert "No GPU run is recorded" in gpu_report.sidebar(None, "mlp")


def test_sample_file_renders_goals_with_the_right_arithmetic():
    results = gpu_report.load_results(SAMPLE)
    goals = {row["goal"]: row for row in gpu_report.goals(results)}
    # 4*B*N*T*S*H / s / bf16 ceiling = 4*4*8*8192^2*128 / 0.0012 / 6e14
    fraction = 4 * 4 * 8 * 8192**2 * 128 / 0.0012 / 6.0e14
    cudnn_goal = goals["cuDNN attention, T = S = 8192, bf16: ≥ 50 % of bf16 matmul FLOP/s"]
    assert cudnn_goal["measured"] == f"{100 * fraction:.1f} %"
    assert cudnn_goal["met"] is (fraction >= 0.5)
    assert goals["cuDNN attention, T = S = 8192, bf16: ≥ 10× naive"]["measured"] == "16.7×"
    assert goals["strict book build on the GPU (reported)"]["measured"] == "200 s"


def test_sidebars_and_plot_show_the_recorded_rows():
    results = gpu_report.load_results(SAMPLE)
    text = gpu_report.sidebar(results, "attention")
    assert "SAMPLE GPU (not a measurement), measured 2000-01-01" in text
    assert "RuntimeError: sample refusal" in text and "| xla | bfloat16 | 0.011 |" in text
    assert "| 128 | 9e+03 | 22 % |" in gpu_report.sidebar(results, "mlp")
    fig, ax = plt.subplots()
    gpu_report.plot_attention(results, ax)
    assert sorted(line.get_label() for line in ax.get_lines()) == [
        "cudnn bfloat16",
        "naive bfloat16",
        "xla bfloat16",
    ]
    plt.close(fig)


def test_bad_results_files_are_refused_with_what_is_wrong(tmp_path):
    results = json.loads(SAMPLE.read_text())
    del results["mlp"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results))
    with pytest.raises(ValueError, match="lacks section\\(s\\) \\['mlp'\\]"):
        gpu_report.load_results(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        gpu_report.load_results(path)
    results = json.loads(SAMPLE.read_text())
    results["facts"]["tiny"] = True
    with pytest.raises(ValueError, match="--tiny pipeline check"):
        gpu_report.check_results(results)
    with pytest.raises(ValueError, match="rows_for"):
        gpu_report.sidebar(json.loads(SAMPLE.read_text()), "transformer")


def test_attention_flops_formula():
    assert (
        gpu_report.attention_flops(batch=3, heads=5, length=7, head_dim=11, is_causal=False)
        == 4 * 3 * 5 * 7 * 7 * 11
    )
    assert (
        gpu_report.attention_flops(batch=3, heads=5, length=7, head_dim=11, is_causal=True)
        == 2 * 3 * 5 * 7 * 7 * 11
    )
