"""Chapter 7's page: whether the standalone whole-loop script (code/examples/whole_loop.py)
reaches what `fit` reaches, and how many ways the seeds' runs can split (book/07_evaluation.md)."""

import math

import numpy as np

# Accuracy, as a fraction of the test set: 2 points are 9 of the book's 450 test digits. `fit`
# over five seeds spreads by about 0.3-0.6 points (standard deviation, this CPU and the TPU
# record alike), so a single run of the same recipe sits well inside; one epoch (about 87 %)
# or none (chance, about 10 %) lies far outside.
WHOLE_LOOP_TOLERANCE = 0.02


def _accuracy(value, name: str) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} {value} is not an accuracy in [0, 1]")
    return value


def whole_loop_gap(script_accuracy: float, fit_accuracies) -> float:
    """The script's test accuracy less the mean of `fit`'s runs (fractions in [0, 1]).

    Raises:
      ValueError: an accuracy outside [0, 1], or no `fit` run to compare with.
    """
    runs = [_accuracy(a, "a fit accuracy") for a in np.ravel(fit_accuracies)]
    if not runs:
        raise ValueError("need at least one fit accuracy, got none")
    return _accuracy(script_accuracy, "the script's accuracy") - float(np.mean(runs))


def whole_loop_matches(
    script_accuracy: float, fit_accuracies, tolerance: float = WHOLE_LOOP_TOLERANCE
) -> bool:
    """True when the script's test accuracy is within `tolerance` of `fit`'s mean.

    Raises:
      ValueError: a tolerance outside [0, 1), or as `whole_loop_gap`.
    """
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance {tolerance} must be in [0, 1)")
    return abs(whole_loop_gap(script_accuracy, fit_accuracies)) <= tolerance


def ways_to_split(n: int, m: int) -> int:
    """The ways to deal n + m runs into a set of n and a set of m: C(n + m, n).

    Raises:
      ValueError: n or m below 1.
    """
    if n < 1 or m < 1:
        raise ValueError(f"need at least one run in each set, got {n} and {m}")
    return math.comb(n + m, n)
