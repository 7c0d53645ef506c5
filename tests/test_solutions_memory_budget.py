"""Chapter 14's exercise answers (jaxloops.solutions.memory_budget)."""

import pytest

from conftest import SMALL_TRANSFORMER
from jaxloops import memory, solutions

T = 7


def step_bytes(batch, extra=0):
    return (
        sum(memory.state_bytes(SMALL_TRANSFORMER).values())
        + extra
        + (memory.activation_bytes(SMALL_TRANSFORMER, batch, T)["total"])
    )


@pytest.mark.parametrize("budget", [10**6, 3 * 10**6, 10**7 + 11])
def test_the_largest_batch_fits_and_one_more_does_not(budget):
    B = solutions.largest_batch(SMALL_TRANSFORMER, T, budget)
    assert B >= 1 and step_bytes(B) <= budget < step_bytes(B + 1)


def test_a_budget_below_one_example_is_refused_by_value():
    with pytest.raises(ValueError, match="a budget of 1000 bytes does not hold one example"):
        solutions.largest_batch(SMALL_TRANSFORMER, T, 1000)


@pytest.mark.parametrize("batch", [12, 35])
def test_the_fewest_micro_batches_fit_and_fewer_do_not(batch):
    grads = memory.state_bytes(SMALL_TRANSFORMER)["grads"]
    budget = step_bytes(batch // 3 + 1, grads)
    M = solutions.fewest_micro_batches(SMALL_TRANSFORMER, batch, T, budget)
    assert batch % M == 0 and step_bytes(batch // M, grads) <= budget
    for fewer in range(1, M):
        if batch % fewer == 0:
            assert step_bytes(batch // fewer, grads) > budget


def test_a_budget_no_m_meets_is_refused():
    with pytest.raises(ValueError, match="does not hold the step even at M = 12"):
        solutions.fewest_micro_batches(SMALL_TRANSFORMER, 12, T, 1000)
