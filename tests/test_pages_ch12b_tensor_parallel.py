import pytest

from jaxloops.measure import published
from jaxloops.pages import ch12b_tensor_parallel as page


def test_the_scaling_books_w_gives_its_2550():
    flops, ring = published.ring_peaks()["TPU v5p, ICI"]
    found = page.two_ws(flops, ring)
    assert round(found["scaling book"]) == 2550
    assert round(found["this book"]) == 4590
    assert found["w_ratio"] == pytest.approx(1.8)
    assert found["this book"] / found["scaling book"] == pytest.approx(found["w_ratio"])
    assert round(page.two_ws(flops, 2 * ring)["this book"]) != 4590  # another W, another batch


def test_two_ws_rejects_a_rate_that_is_not_positive():
    with pytest.raises(ValueError, match="-1"):
        page.two_ws(-1.0, 1e11)
