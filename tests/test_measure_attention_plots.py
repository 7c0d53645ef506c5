"""Chapters 8 and 10's plots: one line per thing drawn, each at its place."""

import numpy as np

from jaxloops.measure import attention_plots

NAMES = {"naive": "naive", "xla": "xla", "blockwise": "blockwise"}


def test_chapter_8_plots_draw_every_line():
    walk = [[np.array([m]), np.array([1.0]), np.array([0.1, 0.2, 0.3])] for m in (1, 2, 2, 3)]
    fig = attention_plots.online_walk(np.arange(24.0) / 8, walk, [0.1, 0.2, 0.3])
    assert len(fig.axes) == 3 and len(fig.axes[1].patches) == 4  # one bar per block
    rows = {
        (name, t): {
            "temp_bytes": t * t if name != "blockwise" else 2 * t,
            "flops": 3 * t * t,
            "seconds": 1e-3,
        }
        for name in NAMES
        for t in (16, 32)
    }
    fig = attention_plots.scratch_and_flops(rows, (16, 32), NAMES, batch=1, heads=1, head_dim=2)
    assert "(same as naive)" in fig.axes[0].get_lines()[1].get_label()
    fig = attention_plots.latency(rows, (16, 32), NAMES, lambda name, t: (1e-3,), title="t")
    assert len(fig.axes[0].get_lines()) == 3 + 2


def test_plots_draw_one_panel_per_kind_and_one_line_per_k():
    assert len(attention_plots.kv_grouping(8, (8, 2, 1)).axes) == 3
    assert len(attention_plots.cache_layout().axes[0].patches) == 2 * 2 * 6
    rows = [{"K": k, "S": s, "seconds": 1e-3, "predicted": 5e-4} for k in (8, 1) for s in (64, 256)]
    fig = attention_plots.decode_times(rows, (8, 1), batch=1, heads=8, head_dim=2)
    assert [len(ax.get_lines()) for ax in fig.axes] == [4, 3]  # 2 x (measured, roofline); 2 + y=1
