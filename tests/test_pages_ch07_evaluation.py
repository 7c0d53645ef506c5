"""Chapter 7's page: the whole-loop comparison and the count of the seeds' splits."""

import pytest

from jaxloops import validation
from jaxloops.pages import ch07_evaluation as page


def test_the_whole_loop_comparison_accepts_a_near_run_and_rejects_a_far_one():
    fit_runs = [0.9711, 0.9756, 0.9778, 0.9733, 0.9800]  # mean 0.97556
    assert page.whole_loop_gap(0.98, fit_runs) == pytest.approx(0.98 - 0.97556)
    assert page.whole_loop_matches(0.9822, fit_runs)
    # One epoch (about 87 %) and no training (chance) are rejected; so is a run 2.1 points
    # above the mean, and the tolerance's edge is inside.
    assert not page.whole_loop_matches(0.8667, fit_runs)
    assert not page.whole_loop_matches(0.0978, fit_runs)
    assert not page.whole_loop_matches(0.97556 + 0.021, fit_runs)
    assert page.whole_loop_matches(0.97556 - 0.019, fit_runs)
    assert not page.whole_loop_matches(0.97556 - 0.019, fit_runs, tolerance=0.01)


@pytest.mark.parametrize(
    "script,runs,tolerance,word",
    [(97.5, [0.97], 0.02, "script"), (0.97, [1.5], 0.02, "fit"), (0.97, [], 0.02, "none"),
     (0.97, [0.97], -0.1, "tolerance")],
)  # fmt: skip
def test_bad_input_is_a_value_error_naming_it(script, runs, tolerance, word):
    with pytest.raises(ValueError, match=word):
        page.whole_loop_matches(script, runs, tolerance)


def test_ways_to_split_ten_runs_into_two_fives():
    assert page.ways_to_split(5, 5) == 252
    assert page.ways_to_split(3, 7) == page.ways_to_split(7, 3) == 120
    # Two of the splits put one set wholly below the other: the page's chance of separation.
    assert 2 / page.ways_to_split(5, 5) == validation.chance_of_separation(5, 5)
    with pytest.raises(ValueError, match="0 and 5"):
        page.ways_to_split(0, 5)
