"""The biggest model that fits, found by compiling (jaxloops.measure.largest_fit)."""

import dataclasses

import jax
import numpy as np
import pytest

import jaxloops
from conftest import SMALL_TRANSFORMER
from jaxloops import memory
from jaxloops.measure import largest_fit as fit
from jaxloops.measure import step_memory as measured


def line(n):
    """Bytes that grow with n: 95 at n = 9 fits a budget of 100, 105 at n = 10 does not."""
    return 10 * n + 5


B, T = 6, 7


@pytest.mark.parametrize("guess", [9, 10, 3, 40, 0, 1000])
def test_the_search_finds_the_exact_boundary_from_any_guess(guess):
    n, probes = fit.largest_near(line, 100, lambda probes: guess, 12)
    assert n == 9 and probes[9] <= 100 < probes[10]
    assert fit.search_problems(probes, 100, n) == []
    assert len(probes) == 2 if guess in (9, 10) else len(probes) <= 6  # right guess: two


def test_a_wrong_upper_end_is_doubled_past_and_the_step_is_kept():
    n, probes = fit.largest_near(line, 10**4, lambda probes: 1, 2)  # 2 fits: no upper end
    assert n == 999 and fit.search_problems(probes, 10**4, n) == [] and len(probes) <= 24
    n, probes = fit.largest_near(line, 100, lambda probes: 5, 12, step=4)
    assert n == 8 and all(k % 4 == 0 for k in probes)
    assert fit.search_problems(probes, 100, n, step=4) == []


def test_the_guess_is_asked_again_with_the_probes_so_far():
    seen = []

    def guess(probes):
        seen.append(dict(probes))
        return 3 if not probes else 9  # a first guess too low, a second one right

    n, probes = fit.largest_near(line, 100, guess, 12)
    assert n == 9 and seen == [{}, {3: 35, 4: 45}]
    assert list(probes) == [3, 4, 9, 10]  # each guess with its neighbour


def test_the_line_through_two_compiled_sizes_predicts_the_boundary():
    # Two sizes on a line of bytes, on one side of the budget or on both: its boundary.
    assert fit.line_guess({3: line(3), 4: line(4)}, 100) == 9
    assert fit.line_guess({20: line(20), 2: line(2), 7: line(7)}, 100) == 9  # 2 and 7 nearest
    # A bent line: the size far from the budget keeps less per example than the two near it.
    # Through the two nearest the budget, 9; through the far one and the nearest beyond, 7.
    assert fit.line_guess({1: 60, 12: 125, 13: 135}, 100) == 9
    assert fit.line_guess({30: line(30), 40: line(40)}, 100) == 9
    assert fit.line_guess({3: line(3), 5: line(5)}, 100, step=4) == 8
    # A refused size (infinite bytes) is no point; one point, or bytes that do not grow, no line.
    assert fit.line_guess({3: line(3), 4: float("inf")}, 100) is None
    assert fit.line_guess({3: 50, 4: 50}, 100) is None
    # Fed to the search, its first guess from two known sizes is right: two probes.
    n, probes = fit.largest_near(line, 100, lambda p: fit.line_guess({1: 15, 2: 25, **p}, 100), 12)
    assert n == 9 and sorted(probes) == [9, 10]


def test_an_off_by_one_answer_is_caught():
    n, probes = fit.largest_near(line, 100, lambda probes: 9, 12)
    assert fit.search_problems(probes, 100, n) == []
    assert fit.search_problems(probes, 100, n - 1) == [
        "the answer 8 was not probed within the budget",  # no compile says it fits
        "9 was not probed over the budget",
    ]
    assert "the answer 10 was not probed within the budget" in fit.search_problems(
        probes, 100, n + 1
    )


def test_bytes_that_do_not_grow_are_caught_where_the_probes_cross_them():
    def dipping(n):  # one size holds fewer bytes than a smaller one: not monotone
        return 50 if n == 11 else line(n)

    n, probes = fit.largest_near(dipping, 100, lambda probes: 40, 50)
    assert n == 11  # the search, which trusts growth, stops at the dip
    assert fit.search_problems(probes, 100, n) == ["50 bytes at 11 <= 95 at 9"]


def test_nothing_fitting_gives_zero_and_everything_fitting_gives_the_limit():
    n, probes = fit.largest_near(lambda n: 10**6 + n, 100, lambda probes: 5, 12)
    assert n == 0 and probes[1] > 100 and fit.search_problems(probes, 100, 0) == []
    n, probes = fit.largest_near(line, 10**9, lambda probes: 5, 12, limit=64)
    assert n == 64  # the limit is not a boundary, and the check says so
    assert fit.search_problems(probes, 10**9, n) == ["65 was not probed over the budget"]


def test_a_size_the_backend_refuses_to_compile_counts_as_over_the_budget(monkeypatch):
    def refusing(config, batch, length, program):  # XLA:TPU, past the chip's memory
        if batch > 12:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in hbm")
        if batch == 11:
            raise jax.errors.JaxRuntimeError("INTERNAL: something else")
        return line(batch)

    monkeypatch.setattr(fit, "held_bytes", refusing)
    assert fit.held_or_over(SMALL_TRANSFORMER, 13, T, {}) == float("inf")
    assert fit.held_or_over(SMALL_TRANSFORMER, 9, T, {}) == 95
    with pytest.raises(jax.errors.JaxRuntimeError, match="something else"):  # not memory
        fit.held_or_over(SMALL_TRANSFORMER, 11, T, {})
    # Bytes a search cannot read past the refusal: a budget beyond them all finds the last
    # size that compiled, and two refused sizes side by side are not a shrinking of bytes.
    held = {n: line(n) if n <= 12 else float("inf") for n in range(64)}
    n, probes = fit.largest_near(held.get, 10**6, lambda probes: 40, 50)
    assert n == 12 and fit.search_problems(probes, 10**6, n) == []
    assert sum(v == float("inf") for v in probes.values()) >= 2


def test_bad_arguments_are_refused_by_value():
    with pytest.raises(ValueError, match="got step = 0, rounds = 2"):
        fit.largest_near(line, 100, lambda probes: 9, 12, step=0)
    with pytest.raises(ValueError, match="high = 10 is not a multiple >= 0 of the step 4"):
        fit.largest_near(line, 100, lambda probes: 9, 10, step=4)
    with pytest.raises(ValueError, match="limit = -3 is not a multiple >= 0 of the step 1"):
        fit.largest_near(line, 100, lambda probes: 9, 12, limit=-3)


def held(layers: int, batch: int, program: dict) -> int:
    config = dataclasses.replace(SMALL_TRANSFORMER, num_layers=layers)
    return measured.held_bytes(config, batch, T, program)


@pytest.mark.parametrize(
    "program", [{}, {"scanned": True, "policy": "nothing", "micro": 3}], ids=["none", "remat+M3"]
)
def test_the_compiled_answer_fits_and_one_more_does_not(program):
    budget = held(3, B, program)  # L = 3 at B fits exactly
    found = fit.compiled_largest(SMALL_TRANSFORMER, B, T, budget, program)
    L, b, step = found["L"]["compiled"], found["B"]["compiled"], found["B"]["step"]
    assert L == 3 and held(4, B, program) > budget
    L0 = SMALL_TRANSFORMER.num_layers  # B is searched at the config's L
    assert step == program.get("micro", 1) and b % step == 0
    assert held(L0, b, program) <= budget < held(L0, b + step, program)
    assert found["L"]["formula"] >= 1 and found["margin"] > 0


def test_the_table_has_a_row_per_technique_with_its_compiles():
    budget = held(3, B, {})
    rows = fit.largest_fit_table(SMALL_TRANSFORMER, B, T, budget, {"none": {}})
    (row,) = rows
    assert row["technique"] == "none" and row["compiled L"] == 3
    assert row["held / budget at L"] == 1.0  # the budget is that size's bytes
    assert row["problems at L"] == row["problems at B"] == []
    assert row["compiles for L"] >= 2 and row["compiles for B"] >= 2
    assert set(measured.TECHNIQUES) >= {"none", "remat, dots saved", "bfloat16 compute"}


def test_one_train_step_runs_and_its_loss_is_the_models():
    tokens = jax.random.randint(jax.random.key(1), (B, T + 1), 0, SMALL_TRANSFORMER.vocab_size)
    data = jaxloops.Batch(tokens[:, :-1], tokens[:, 1:])
    key = jax.random.key(2)
    run = fit.run_train_step(SMALL_TRANSFORMER, data, {}, key)
    params = jaxloops.init_transformer(key, SMALL_TRANSFORMER)
    loss = float(jax.jit(jaxloops.transformer_loss)(params, data)[0])
    assert run["completed"] and run["error"] is None
    terms = memory.rounding_terms(SMALL_TRANSFORMER, T, extra=B * T)  # two compiles' rounding
    np.testing.assert_allclose(run["loss"], loss, rtol=terms * float(np.finfo(np.float32).eps))
    assert run["step_held"] > 0
    reports = jax.devices()[0].memory_stats() is not None  # None on a CPU
    assert (run["before"] is not None) == (run["after"] is not None) == reports


def test_the_table_is_the_same_whether_its_searches_run_at_once_or_in_turn(monkeypatch):
    """The searches share nothing, so running them in threads changes no answer and no
    probe; `compile_count` sees every program once either way."""
    import concurrent.futures

    budget = held(3, B, {})  # L = 3 at B fits without remat
    techniques = {k: measured.TECHNIQUES[k] for k in ("none", "remat, nothing saved")}
    measured._grad_program.cache_clear()
    monkeypatch.setattr(fit, "SEARCHES_AT_ONCE", 10)  # as a host with 20 cores would run it
    at_once = fit.largest_fit_table(SMALL_TRANSFORMER, B, T, budget, techniques)
    compiles = measured.compile_count()

    class InTurn(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, max_workers=None, **kwargs):
            super().__init__(max_workers=1, **kwargs)

    monkeypatch.setattr(fit.concurrent.futures, "ThreadPoolExecutor", InTurn)
    measured._grad_program.cache_clear()
    in_turn = fit.largest_fit_table(SMALL_TRANSFORMER, B, T, budget, techniques)
    assert in_turn == at_once and at_once[0]["compiled L"] == 3
    assert measured.compile_count() == compiles
