"""Chapter 8b's figures and plots on the blockwise kernel: each derived from known rows, and
each wrong row rejected."""

import numpy as np

from jaxloops.measure.roofline import Roofline
from jaxloops.pages import ch08b_blockwise as page


def test_grad_memory_figures_divide_by_the_custom_vjp():
    memory = [
        {"forward": 4.0, "grad": 16.0},
        {"forward": 1.0, "grad": 2.0},
        {"forward": 1.0, "grad": 32.0},
    ]
    figures = page.grad_memory_figures(memory, 1, 2, 512)
    assert figures["grad_ratio"] == 8.0 and figures["plain_ratio"] == 16.0
    assert figures["plain_scores_copies"] == 32.0 * 2**20 / (2 * 512 * 512 * 4)  # 16 copies
    assert figures["naive_fwd_mib"] == 4.0


def test_the_online_walk_draws_one_bar_per_block():
    walk = [[np.array([m]), np.array([1.0]), np.array([0.1, 0.2, 0.3])] for m in (1, 2, 2, 3)]
    fig = page.online_walk(np.arange(24.0) / 8, walk, [0.1, 0.2, 0.3])
    assert len(fig.axes) == 3 and len(fig.axes[1].patches) == 4  # one bar per block


def test_tile_passes_split_matmuls_from_softmax_passes():
    fusions = [
        {"dims": (8, 4), "ops": "dot", "ms": 3.0},
        {"dims": (8, 4), "ops": "exponential", "ms": 1.0},
        {"dims": (8,), "ops": "reduce", "ms": 0.5},
        {"dims": (8, 2), "ops": "add", "ms": 9.0},
    ]
    score_sized, split = page.tile_passes(fusions, 8, 4)
    assert len(score_sized) == 2 and split == {"dots_ms": 3.0, "softmax_ms": 1.5}
    assert "took 3 ms per call, 1.50 times the 2 ms" in page.trace_note(split, 6.0, 2.0)
    untimed = [dict(f, ms=None) for f in fusions]
    assert page.tile_passes(untimed, 8, 4)[1] is None
    assert "does not name" in page.trace_note(None, 0.0, 1.0)


def test_tile_figures():
    parts = [
        {"part": name, "seconds": s, "flops": 8.0}
        for name, s in (
            ("  scores: Q Kᵀ", 1.0),
            ("  online softmax step (all of it)", 2.0),
            ("whole (blockwise)", 4.0),
            ("square matmul, same FLOPs", 2.0),
        )
    ]
    figures = page.tile_figures(parts, 8, 4)
    assert figures["tile_total_ms"] == 3000.0 and figures["block_vs_square"] == 2.0
    assert figures["square_rate"] == 4.0 and figures["tile_mib"] == 128 / 2**20


def test_square_against_ceiling_keeps_a_ceiling_it_does_not_beat():
    roof = Roofline("test", 1e9, (1e9,), 1e8, (1e8,), 8, 4)
    kept, fraction, note = page.square_against_ceiling(0.5e9, roof)
    assert kept is roof and fraction == 0.5 and note == ""


def test_memory_rows_count_a_refused_program_and_say_so():
    refused = {"temp_bytes": int(18.13 * 2**30), "available_bytes": int(15.75 * 2**30),
               "memory": "HBM", "error": "RESOURCE_EXHAUSTED: ..."}  # fmt: skip

    def scratch(fn, grad):  # a TPU v5e at T = 16384: plain jax.grad of the walk refused
        if fn == "plain" and grad:
            return {"temp_bytes": refused["temp_bytes"], "refused": refused}
        return {"temp_bytes": {"naive": 8, "vjp": 1, "plain": 1}[fn] * 2**30, "refused": None}

    memory = page.memory_rows({"naive": "naive", "custom VJP": "vjp", "plain grad": "plain"},
                              scratch)  # fmt: skip
    assert [row["fits"] for row in memory[:2]] == ["yes", "yes"]
    assert memory[2]["fits"] == "no: grad refused, 18.13 GiB asked of 15.75"
    assert memory[2]["grad"] == refused["temp_bytes"] / 2**20 and memory[2]["forward"] == 1024
    figures = page.grad_memory_figures(memory, 1, 8, 16384)
    assert round(figures["plain_scores_copies"], 2) == 2.27  # 18.13 GiB of 8 GiB scores
    note = page.refused_note(memory)
    assert '"plain grad" (its gradient) asks for 18.13 GiB' in note and "15.75 GiB of HBM" in note
    assert "cannot run on that device" in note
    assert page.refused_note(memory[:2]) == "Every one of these programs compiled."
