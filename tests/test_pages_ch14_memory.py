"""Chapter 14's figures: one point per policy, each named in the legend."""

from conftest import SMALL_TRANSFORMER
from jaxloops.memory import step_bytes
from jaxloops.pages import ch14_memory as page


def test_each_remat_policy_is_one_point_named_in_the_legend(plt):
    rows = [
        {"policy": "no remat", "extra GFLOP per block": 0.0, "temp MiB": 24.5},
        {"policy": "names", "extra GFLOP per block": 0.035, "temp MiB": 4.9},
        {"policy": "nothing", "extra GFLOP per block": 0.040, "temp MiB": 4.6},
    ]
    fig = page.remat_tradeoff(rows)
    ax = fig.axes[0]
    points = {line.get_label(): (*line.get_xdata(), *line.get_ydata()) for line in ax.get_lines()}
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    plt.close(fig)
    assert points == {"no remat": (0.0, 24.5), "names": (0.035, 4.9), "nothing": (0.040, 4.6)}
    assert legend == ["no remat", "names", "nothing"]


def test_fits_budget_is_the_formula_at_the_budget():
    config = SMALL_TRANSFORMER
    need = sum(step_bytes(config, 6, 5))
    assert page.fits_budget(config, 5, need)(6) and not page.fits_budget(config, 5, need - 1)(6)
    # Two micro-batches of 3 hold less than one batch of 6 (a budget of M * B would not).
    halves = sum(step_bytes(config, 6, 5, micro=2))
    assert halves < need and page.fits_budget(config, 5, halves)(3, 2)
    assert not page.fits_budget(config, 5, halves)(6)
