import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
import numpy as np  # noqa: E402

from jaxloops import measure  # noqa: E402


def test_draw_tree_shows_each_leaf_with_its_path_shape_and_mean_magnitude():
    tree = {"dense_0": {"b": np.full((3,), -2.0), "w": np.ones((5, 3))}, "scale": [np.zeros(7)]}
    fig, ax = plt.subplots()
    measure.draw_tree(ax, tree, "params", "C0")
    texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    assert texts == [
        "dense_0/b  (3,)   |2.0e+00| mean",
        "dense_0/w  (5, 3)   |1.0e+00| mean",
        "scale/0  (7,)   |0.0e+00| mean",
    ]
    assert ax.get_title() == "params"
