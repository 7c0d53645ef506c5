"""Chapter 14's remat figure: one point per policy, each named in the legend."""

from jaxloops.measure import memory_plots


def test_each_remat_policy_is_one_point_named_in_the_legend(plt):
    rows = [
        {"policy": "no remat", "extra GFLOP per block": 0.0, "temp MiB": 24.5},
        {"policy": "names", "extra GFLOP per block": 0.035, "temp MiB": 4.9},
        {"policy": "nothing", "extra GFLOP per block": 0.040, "temp MiB": 4.6},
    ]
    fig = memory_plots.remat_tradeoff(rows)
    ax = fig.axes[0]
    points = {line.get_label(): (*line.get_xdata(), *line.get_ydata()) for line in ax.get_lines()}
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    plt.close(fig)
    assert points == {"no remat": (0.0, 24.5), "names": (0.035, 4.9), "nothing": (0.040, 4.6)}
    assert legend == ["no remat", "names", "nothing"]
