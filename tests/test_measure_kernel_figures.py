"""Chapter 8's kernel figures: the tile's passes, the tile parts, cuDNN, numerics."""

import pytest

from jaxloops.measure import kernel_figures
from jaxloops.measure.roofline import Roofline


def test_tile_passes_split_matmuls_from_softmax_passes():
    fusions = [
        {"dims": (8, 4), "ops": "dot", "ms": 3.0},
        {"dims": (8, 4), "ops": "exponential", "ms": 1.0},
        {"dims": (8,), "ops": "reduce", "ms": 0.5},
        {"dims": (8, 2), "ops": "add", "ms": 9.0},
    ]
    score_sized, split = kernel_figures.tile_passes(fusions, 8, 4)
    assert len(score_sized) == 2 and split == {"dots_ms": 3.0, "softmax_ms": 1.5}
    assert "took 3 ms per call, 1.50 times the 2 ms" in kernel_figures.trace_note(split, 6.0, 2.0)
    untimed = [dict(f, ms=None) for f in fusions]
    assert kernel_figures.tile_passes(untimed, 8, 4)[1] is None
    assert "does not name" in kernel_figures.trace_note(None, 0.0, 1.0)


def test_tile_and_cudnn_figures():
    parts = [
        {"part": name, "seconds": s, "flops": 8.0}
        for name, s in (
            ("  scores: Q Kᵀ", 1.0),
            ("  online softmax step (all of it)", 2.0),
            ("whole (blockwise)", 4.0),
            ("square matmul, same FLOPs", 2.0),
        )
    ]
    figures = kernel_figures.tile_figures(parts, 8, 4)
    assert figures["tile_total_ms"] == 3000.0 and figures["block_vs_square"] == 2.0
    assert figures["square_rate"] == 4.0 and figures["tile_mib"] == 128 / 2**20
    report = [
        {"implementation": "cudnn", "works": False, "error": "no GPU"},
        {"implementation": "xla", "works": True, "error": ""},
    ]
    assert kernel_figures.cudnn_figures(report) == {
        "cudnn_status": "refused every request",
        "cudnn_error": "no GPU",
    }


def test_square_against_ceiling_keeps_a_ceiling_it_does_not_beat():
    roof = Roofline("test", 1e9, (1e9,), 1e8, (1e8,), 8, 4)
    kept, fraction, note = kernel_figures.square_against_ceiling(0.5e9, roof)
    assert kept is roof and fraction == 0.5 and note == ""


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
    figures = kernel_figures.numerics_figures(rows)
    assert figures["err_f32"] == 3e-7 and figures["err_bf16"] == 9e-3
    assert figures["bf16_errors"] == [2e-3, 1e-3]  # cuDNN is not one of the three compared
    with pytest.raises(KeyError):
        kernel_figures.numerics_figures(rows[:3])  # no bfloat16 row ran
