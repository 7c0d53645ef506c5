"""Chapter 8's figures, tables and plots: each derived from known rows, and each wrong row
rejected."""

import pytest

from jaxloops.measure.roofline import Roofline
from jaxloops.pages import ch08_attention as page

ROOF = Roofline("test", 1e9, (1e9, 0.9e9), 1e8, (1e8,), 8, 4)  # 1 GFLOP/s, 100 MB/s
NAMES = {"naive": "naive", "xla": "xla", "blockwise": "blockwise"}


def sweep(lengths=(16, 32), seconds=None):
    """(implementation, T) -> row: naive's scratch and FLOPs grow as T², blockwise's as T."""
    rows = {}
    for t in lengths:
        for name, temp in (("naive", t * t), ("xla", t * t), ("blockwise", 2 * t)):
            rows[name, t] = {
                "temp_bytes": temp,
                "flops": 3 * t * t,
                "bytes_accessed": 8 * t,
                "seconds": (seconds or {}).get(name, 1e-3),
            }
    return rows


def test_growth_figures_per_doubling_at_the_two_longest_lengths():
    figures = page.growth_figures(sweep((8, 16, 32)), (8, 16, 32), 1, 1)
    assert figures["T_prev"] == 16 and figures["naive_mem_growth"] == 4.0
    assert figures["flop_growth"] == 4.0 and figures["block_mem_growth"] == 2.0
    assert figures["mem_ratio"] == 16.0 and figures["naive_scores_copies"] == 0.25
    with pytest.raises(ValueError, match=r"\[32\]"):
        page.growth_figures(sweep((32,)), (32,), 1, 1)


def test_prediction_timing_and_table_keep_implementations_apart():
    rows = sweep(seconds={"naive": 4e-3, "xla": 2e-3, "blockwise": 1e-3})
    prediction = {
        "naive": (2e-3, "compute", 1e5),
        "xla": (1e-3, "memory", 1e5),
        "blockwise": (1e-3, "compute", 1e4),
    }
    figures = page.prediction_figures(prediction, ROOF, 32)
    assert figures["naive_bytes_ms"] == 1.0 and figures["naive_gib"] == 1e5 / 2**30
    assert figures["peak_spread"] == 100 * ROOF.spread("flops") > 0
    timed = page.timing_figures(rows, prediction, 32)
    assert timed["naive_ratio"] == 2.0 and timed["block_ratio"] == 1.0
    assert timed["block_speedup"] == 4.0 and timed["xla_vs_naive"] == 0.5
    table = page.prediction_table(rows, prediction, NAMES, 32)
    assert [r["ratio"] for r in table] == [2.0, 2.0, 1.0]


def test_fusion_figures_find_where_the_exponentials_went():
    naive = [
        {"fusion": "a", "ops": "dot, exponential", "elements": 64},
        {"fusion": "b", "ops": "dot", "elements": 16},
    ]
    xla = [
        {"fusion": "c", "ops": "transpose", "elements": 64},
        {"fusion": "d", "ops": "dot, exponential", "elements": 16},
    ]
    figures = page.fusion_figures(naive, xla, 64, 8)
    assert figures["naive_softmax_home"].startswith("the first matmul")
    assert figures["xla_softmax_home"].startswith("the second matmul")
    assert figures["xla_full_passes"] == "c (transpose)"
    assert page.softmax_home(naive[1:], 8) == "a kernel of its own"


def test_parts_figures_pair_calls_and_find_the_worst_move():
    def part(name, seconds, predicted, samples):
        return {
            "part": name,
            "seconds": seconds,
            "predicted": predicted,
            "ratio": seconds / predicted,
            "samples": samples,
            "transcendentals": 100,
            "bytes_accessed": 8.0,
            "flops": 4.0,
        }

    parts = [
        part("scores: Q Kᵀ", 2.0, 1.0, (2.0, 2.0, 2.0)),
        part("softmax", 3.0, 0.5, (3.0, 6.0, 3.0)),
        part("mix: weights V", 1.0, 0.9, (1.0, 1.0, 1.0)),
        part("whole (naive)", 6.0, 2.0, (6.0, 6.0, 6.0)),
        part("control: softmax, exp → 1 / (1 - x)", 2.0, 0.5, (1.0, 2.0, 3.0)),
        part("control: square matmul, FLOPs of Q Kᵀ", 1.0, 1.0, (1.0, 1.0, 1.0)),
    ]
    figures = page.parts_figures(parts)
    assert (figures["exp_ratio_low"], figures["exp_ratio"], figures["exp_ratio_high"]) == (
        1.0,
        3.0,
        3.0,
    )  # 3/1, 6/2, 3/3 sorted: a ratio of medians would say 1.5
    assert figures["worst_part"] == "softmax" and figures["worst_excess_ms"] == 2500.0
    assert figures["qk_vs_square"] == 2.0 and figures["parts_share"] == 50.0


def test_formula_ratios_divide_the_compiled_scratch_by_the_formula():
    formula = lambda b, n, t, s, dtype: 2 * b * n * t * s * 4  # noqa: E731  (two score arrays)
    figures = page.formula_ratios(sweep((16, 32)), 16, 32, formula, 1, 1)
    assert figures["ex_ratio_long"] == figures["ex_ratio_short"] == 1 / 8  # sweep keeps T²
    assert figures["ex_formula_mib"] == 8 * 32 * 32 / 2**20 and figures["ex_T_short"] == 16


def test_numerics_figures_take_the_worst_of_each_dtype():
    rows = [
        {"implementation": i, "dtype": d, "max_abs_error": e}
        for i, d, e in (
            ("naive", "float32", 1e-7),
            ("xla", "float32", 3e-7),
            ("cudnn", "float32", None),
            ("naive", "bfloat16", 2e-3),
            ("cudnn", "bfloat16", 9e-3),
            ("blockwise", "bfloat16", 1e-3),
        )
    ]
    figures = page.numerics_figures(rows)
    assert figures["err_f32"] == 3e-7 and figures["err_bf16"] == 9e-3
    assert figures["bf16_errors"] == [2e-3, 1e-3]  # cuDNN is not one of the three compared
    with pytest.raises(KeyError):
        page.numerics_figures(rows[:3])  # no bfloat16 row ran


def test_chapter_8_plots_draw_every_line():
    rows = {
        (name, t): {
            "temp_bytes": t * t if name != "blockwise" else 2 * t,
            "flops": 3 * t * t,
            "seconds": 1e-3,
        }
        for name in NAMES
        for t in (16, 32)
    }
    fig = page.scratch_and_flops(rows, (16, 32), NAMES, batch=1, heads=1, head_dim=2)
    assert "(same as naive)" in fig.axes[0].get_lines()[1].get_label()
    fig = page.latency(rows, (16, 32), NAMES, lambda name, t: (1e-3,), title="t")
    assert len(fig.axes[0].get_lines()) == 3 + 2


def test_cudnn_figures():
    report = [
        {"implementation": "cudnn", "works": False, "error": "no GPU"},
        {"implementation": "xla", "works": True, "error": ""},
    ]
    assert page.cudnn_figures(report) == {
        "cudnn_status": "refused every request",
        "cudnn_error": "no GPU",
    }
