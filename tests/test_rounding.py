"""This backend's rounding, measured: float32's epsilon at least, and an operation that rounds
worse is found."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxloops import equivalence, rounding


def test_backend_eps_is_float32s_at_least_and_measures_each_operation():
    errors = rounding.backend_errors()
    assert set(errors) == {"exp", "log", "divide", "sqrt", "matmul"}
    assert all(0 <= e < 1e-2 for e in errors.values()), errors
    eps = float(np.finfo(np.float32).eps)
    assert rounding.backend_eps() == max(eps, *errors.values())
    assert equivalence.backend_eps is rounding.backend_eps  # the bounds' module re-exports it


def test_backend_eps_finds_an_operation_that_rounds_worse(monkeypatch):
    """An exp wrong by 1e-3 relative is seen as that error, give or take this backend's own
    exp error: 9 times the worst operation a TPU v5e measured (log, 1.1e-4), 190 times its
    exp (5.2e-6), so a measurement that missed it cannot pass for it on either backend."""
    own = rounding.backend_errors()["exp"]  # a CPU's below float32's eps; a TPU v5e's 5.2e-6
    factor = np.float32(1 + 1e-3)
    wrong = float(factor) - 1  # the injected relative error, as float32 holds it
    # Each exponential is off by (1 + e)(1 + wrong)(1 + r) - 1, with |e| <= own its own error
    # and |r| <= eps / 2 the product's rounding: the measured maximum is `wrong` within this.
    tolerance = own * (1 + wrong) + float(np.finfo(np.float32).eps)
    assert abs(own - wrong) > tolerance  # the backend's own exp, unchanged, is rejected
    exp = jnp.exp
    monkeypatch.setattr(jnp, "exp", lambda x: exp(x) * factor)
    rounding._backend_errors.cache_clear()  # measured again, with the wrong exp
    try:
        got = rounding.backend_errors()["exp"]
        assert abs(got - wrong) <= tolerance, (got, wrong, own)
        # A bound over the exponentials and logs multiplies the wrong exp's error.
        assert rounding.backend_eps(rounding.LOG_SUM_EXP) == got <= rounding.backend_eps()
    finally:
        rounding._backend_errors.cache_clear()  # the next test measures the real one


def test_backend_eps_of_some_operations_and_an_unknown_one():
    errors, eps = rounding.backend_errors(), float(np.finfo(np.float32).eps)
    assert rounding.backend_eps(("exp", "log")) == max(eps, errors["exp"], errors["log"])
    assert rounding.backend_eps(rounding.ATTENTION) <= rounding.backend_eps()
    with pytest.raises(ValueError, match=r"no measured error for \['tanh'\]"):
        rounding.backend_eps(("exp", "tanh"))
