import jax
import numpy as np
import pytest

import jaxloops
from jaxloops import schedule
from jaxloops.equivalence import UNIT_ROUNDOFF

PEAK, WARMUP, TOTAL = 3e-3, 7, 41


def applied_rates(key, optimizer, steps: int) -> np.ndarray:
    """The rate each of `steps` updates used, read back from the state after each."""
    params = jaxloops.init_mlp(key, (5, 7, 3))
    grads = jax.tree.map(np.ones_like, params)
    update = jax.jit(optimizer.update)  # init and update: one program each, not one per op
    state, rates = jax.jit(optimizer.init)(params), []
    for _ in range(steps):
        _, state = update(grads, state, params)
        rates.append(schedule.applied_learning_rate(state))
    return np.asarray(jax.device_get(rates))


def test_the_rate_read_back_from_the_state_is_the_formula(key):
    optimizer = schedule.make_scheduled_optimizer(
        schedule.warmup_cosine(PEAK, warmup_steps=WARMUP, total_steps=TOTAL), 1e-2
    )
    applied = applied_rates(key, optimizer, TOTAL)
    assert applied[0] == 0 and applied.max() == pytest.approx(PEAK, rel=1e-6)
    assert schedule.schedule_error(applied, PEAK, WARMUP, TOTAL) <= 1


@pytest.mark.parametrize(
    "wrong",
    [
        lambda t: schedule.warmup_cosine_formula(t + 1, PEAK, WARMUP, TOTAL),  # one step late
        lambda t: schedule.warmup_cosine_formula(t, PEAK, WARMUP + 1, TOTAL),  # longer warm-up
        lambda t: schedule.warmup_cosine_formula(t, PEAK, WARMUP, TOTAL + 1),  # longer run
        lambda t: schedule.warmup_cosine_formula(t, PEAK * (1 + 1e-5), WARMUP, TOTAL),
    ],
)
def test_a_wrong_schedule_fails_the_comparison(wrong):
    assert schedule.schedule_error(wrong(np.arange(TOTAL)), PEAK, WARMUP, TOTAL) > 1


def test_a_constant_schedule_updates_as_make_optimizer_does(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    grads = jax.tree.map(lambda p: np.cos(np.asarray(p) + 1.0), params)
    plain = jaxloops.make_optimizer(1e-2, 0.1)
    scheduled = schedule.make_scheduled_optimizer(lambda count: 1e-2, 0.1)
    # Each optimizer's first update as one jitted program (init + update), not op by op.
    first_update = lambda opt: jax.jit(lambda g, p: opt.update(g, opt.init(p), p)[0])
    want = first_update(plain)(grads, params)
    got = first_update(scheduled)(grads, params)
    # inject_hyperparams keeps b2 = 0.999 as a float32 array: its rounding (u relative) is
    # amplified by b2 / (1 - b2) ~ 1000 in the bias correction 1 - b2^t, then halved by the
    # square root; so the two may differ by about 1000 u relative, and no more.
    rtol = 1000 * UNIT_ROUNDOFF
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=0)
    # A rate off by 1 % would not pass.
    off = first_update(schedule.make_scheduled_optimizer(lambda count: 1.01e-2, 0.1))(grads, params)
    off_b, want_b = np.asarray(off["dense_0"]["b"]), np.asarray(want["dense_0"]["b"])
    assert np.abs(off_b / want_b - 1).max() > rtol


@pytest.mark.parametrize(
    "peak, warmup, total, match",
    [
        (1e-3, 50, 50, "warm-up of 50 steps"),
        (1e-3, 60, 50, "warm-up of 60 steps"),
        (1e-3, 0, 50, "warm-up of 0 steps"),
        (0.0, 5, 50, "peak learning rate 0.0"),
        (float("nan"), 5, 50, "peak learning rate nan"),
    ],
)
def test_bad_schedules_are_rejected_by_value(peak, warmup, total, match):
    with pytest.raises(ValueError, match=match):
        schedule.warmup_cosine(peak, warmup_steps=warmup, total_steps=total)


def test_reading_a_rate_from_a_state_without_one_is_an_error(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    with pytest.raises(ValueError, match="keeps no hyperparams"):
        schedule.applied_learning_rate(jax.jit(jaxloops.make_optimizer(1e-3, 0.0).init)(params))
    with pytest.raises(ValueError, match="weight_decay"):
        schedule.make_scheduled_optimizer(lambda count: 1e-3, -1.0)
