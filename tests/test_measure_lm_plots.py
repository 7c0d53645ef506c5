"""Chapter 11's plots: the training curves and one head's map."""

import numpy as np

from jaxloops.measure import lm_plots

PROBES = ("trained windows", "unseen train text", "validation")


def test_plots_draw_each_curve_and_the_map():
    fig = lm_plots.training_curves(
        [3.0, 2.0],
        [0, 1, 2],
        {p: [4, 3, 2] for p in PROBES},
        steps_per_epoch=5,
        vocab_size=64,
        title="t",
    )
    assert len(fig.axes[0].get_lines()) == 1 + 3 + 1  # train, three probes, ln V
    assert list(fig.axes[0].get_lines()[1].get_xdata()) == [0, 5, 10]
    fig = lm_plots.attention_weights(np.tril(np.ones((3, 3))) / 3, "a b", title="t")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "␣", "b"]
