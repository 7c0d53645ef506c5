import numpy as np

from jaxloops.pages import render


def test_draw_tree_shows_each_leaf_with_its_path_shape_and_mean_magnitude(plt):
    tree = {"dense_0": {"b": np.full((3,), -2.0), "w": np.ones((5, 3))}, "scale": [np.zeros(7)]}
    fig, ax = plt.subplots()
    render.draw_tree(ax, tree, "params", "C0")
    texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    assert texts == [
        "dense_0/b  (3,)   |2.0e+00| mean",
        "dense_0/w  (5, 3)   |1.0e+00| mean",
        "scale/0  (7,)   |0.0e+00| mean",
    ]
    assert ax.get_title() == "params"


def test_draw_params_shows_every_layer_and_array(plt):
    params = {f"dense_{i}": {"w": np.zeros((3 + i, 5)), "b": np.zeros(5)} for i in range(2)}
    fig, ax = plt.subplots()
    render.draw_params(ax, params)
    texts = [t.get_text() for t in ax.texts if t.get_text()]  # the arrows have no text
    plt.close(fig)
    assert texts == ["params\n(dict)", '"dense_0"', '"w": array (3, 5)', '"b": array (5,)',
                     '"dense_1"', '"w": array (4, 5)', '"b": array (5,)']  # fmt: skip


def test_draw_scan_draws_one_step_box_per_step_and_the_carry(plt):
    fig, ax = plt.subplots()
    render.draw_scan(ax, steps=3)
    texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    assert texts.count("train_step") == 3 and len(ax.patches) == 3
    assert {"batches[2]", "metrics[2]", "final\ncarry"} <= set(texts)


def test_draw_throughput_plots_each_sweep_as_a_share_of_the_ceiling(plt):
    sweeps = {
        "narrow": [{"batch_size": b, "examples_per_s": 10.0 * b, "flops_per_s": 2.0 * b}
                   for b in (8, 32)],
        "wide": [{"batch_size": b, "examples_per_s": 5.0 * b, "flops_per_s": 6.0 * b}
                 for b in (8, 32)],
    }  # fmt: skip
    fig, (left, right) = plt.subplots(1, 2)
    render.draw_throughput(left, right, sweeps, ceiling=128.0)
    percents = [list(line.get_ydata()) for line in right.get_lines()[:2]]
    plt.close(fig)
    assert percents == [[12.5, 50.0], [37.5, 150.0]]  # 100 * flops_per_s / ceiling
    assert right.get_ylim()[1] == 1.1 * 150.0  # room above the highest share
