"""Mixed precision and dynamic loss scaling (jaxloops.precision)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxloops
import memory_model
from conftest import SMALL_TRANSFORMER
from jaxloops import memory, precision

W = 2.0**-20  # a loss this small loses its float16 gradients to underflow


@pytest.fixture(scope="module")
def model():
    # The float32 reference gradient (jitted) as NumPy: the checks' arithmetic runs in NumPy.
    params, batch, _, grads = memory_model.model()
    return params, batch, jax.device_get(grads)


def tiny_loss(params, batch):
    loss, aux = jaxloops.transformer_loss(params, batch)
    return W * loss, aux


# One Adam, its init and the scaled float16 step, compiled once for the tests that share them.
ADAM = optax.adam(1e-2, eps=1e-12)
ADAM_INIT = jax.jit(ADAM.init)  # one program, not a zeros per leaf shape
HALF_LOSS = precision.compute_in(tiny_loss, jnp.float16)
SCALED_STEP = jax.jit(precision.make_scaled_step(HALF_LOSS, ADAM, growth_interval=10))


def train(step, params, state, batch, steps=30):
    """`steps` calls of the jitted `step` on one batch."""
    losses = []
    for _ in range(steps):
        params, state, metrics = step(params, state, batch)
        losses.append(float(metrics["loss"]) / W)
    return losses, state, metrics


def test_mixed_precision_keeps_float32_master_parameters_and_gradients(model):
    params, batch, reference = model  # reference: the float32 gradient, jitted
    loss = precision.compute_in(jaxloops.transformer_loss, jnp.bfloat16)
    value, grads = jax.jit(jax.value_and_grad(lambda p: loss(p, batch)[0]))(params)
    assert value.dtype == jnp.float32
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    grads = jax.device_get(grads)
    # Close to float32 within bfloat16's rounding, and not identical: it did compute in bf16.
    error, scale = memory.max_error(reference, grads)
    assert 0 < error <= 64 * float(jnp.finfo(jnp.bfloat16).eps) * scale


def test_bytes_per_parameter_is_the_arithmetic_of_each_scheme(model):
    params, _, _ = model
    adamw = jaxloops.make_optimizer(1e-3, 0.1)
    # Bytes are sizes and dtypes: the states' shapes and dtypes (eval_shape), nothing compiled.
    init = lambda tree: jax.eval_shape(adamw.init, tree)  # noqa: E731
    count = memory.parameter_count(SMALL_TRANSFORMER)
    got = precision.bytes_per_parameter(params, init(params))
    assert got == pytest.approx(12 + 4 / count)  # params, mu, nu; Adam's int32 step count
    mixed = precision.bytes_per_parameter(params, init(params), compute_dtype=jnp.bfloat16)
    assert mixed == pytest.approx(14 + 4 / count)
    half = jax.eval_shape(lambda p: precision.cast_floats(p, jnp.bfloat16), params)
    assert precision.bytes_per_parameter(half, init(half)) == pytest.approx(6 + 4 / count)


def test_loss_scaling_recovers_a_run_that_float16_alone_loses(model):
    params, batch, _ = model
    step_32 = jax.jit(jaxloops.make_train_step(tiny_loss, ADAM))
    f32, _, _ = train(step_32, params, ADAM_INIT(params), batch)
    g16, g32 = jax.jit(  # one program for both gradients
        lambda p: [jax.grad(lambda q, f=f: f(q, batch)[0])(p) for f in (HALF_LOSS, tiny_loss)]
    )(params)
    g16, g32 = jax.device_get(g16), jax.device_get(g32)  # compared in NumPy
    assert precision.zero_gradients(g16, g32) > memory.parameter_count(SMALL_TRANSFORMER) / 2
    step_16 = jax.jit(jaxloops.make_train_step(HALF_LOSS, ADAM))
    f16, _, _ = train(step_16, params, ADAM_INIT(params), batch)
    scaled, (_, scale), _ = train(
        SCALED_STEP, params, (ADAM_INIT(params), precision.init_loss_scale(2.0**15)), batch
    )
    assert f32[0] - f32[-1] > 1.0  # float32 learns this batch
    assert f16[0] - f16[-1] < 0.2 * (f32[0] - f32[-1])  # float16 alone barely moves
    assert abs(scaled[-1] - f32[-1]) < 0.1 * (f32[0] - f32[-1])  # scaled float16 follows float32
    assert float(scale.scale) >= 2.0**15


def test_a_non_finite_gradient_skips_the_step_and_halves_the_scale(model):
    params, batch, _ = model
    # The loss-scaling test's step (compiled once for both): its Adam's eps cannot matter here.
    state = (ADAM_INIT(params), precision.init_loss_scale(2.0**60))  # overflows float16
    new_params, (_, scale), metrics = SCALED_STEP(params, state, batch)
    assert bool(metrics["skipped"])
    unchanged = jax.tree.map(
        lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), new_params, params
    )
    assert all(jax.tree.leaves(unchanged))
    assert float(scale.scale) == 2.0**59 and int(scale.good_steps) == 0


def test_the_scale_doubles_after_a_run_of_good_steps():
    update = jax.jit(precision.update_scale, static_argnames="growth_interval")  # one program
    state = precision.init_loss_scale(8.0)
    for _ in range(2):
        state = update(state, jnp.bool_(True), growth_interval=3)
    assert float(state.scale) == 8.0 and int(state.good_steps) == 2
    state = update(state, jnp.bool_(True), growth_interval=3)
    assert float(state.scale) == 16.0 and int(state.good_steps) == 0


@pytest.mark.parametrize("scale", [1000.0, 0.0, -4.0, 3, float("inf"), float("nan"), "8"])
def test_a_loss_scale_that_is_not_a_positive_power_of_two_is_refused_by_value(scale):
    with pytest.raises(ValueError, match="positive power of two, got"):
        precision.init_loss_scale(scale)


@pytest.mark.parametrize("scale", [1.0, 2.0**15, 0.5, 64])
def test_powers_of_two_are_accepted(scale):
    assert float(precision.init_loss_scale(scale).scale) == scale


def test_a_bad_growth_interval_is_refused():
    with pytest.raises(ValueError, match="growth_interval must be a positive int, got 0"):
        precision.make_scaled_step(tiny_loss, optax.adam(1e-2), 0)


def test_curve_gap_is_the_largest_relative_gap_and_sees_a_shifted_curve():
    reference = np.array([4.0, 3.0, 2.5, 2.0], np.float32)  # float32, as the curves are
    assert precision.curve_gap(reference, reference * (1 + 2.0**-9)) == pytest.approx(2.0**-9)
    # One epoch out of step (the off-by-one a wrong data order gives) is far outside a
    # bfloat16 rounding.
    shifted = np.concatenate([reference[1:], reference[-1:]])
    assert precision.curve_gap(reference, shifted) > float(jnp.finfo(jnp.bfloat16).eps)
    with pytest.raises(ValueError, match=r"\(4,\) and \(3,\)"):
        precision.curve_gap(reference, reference[:3])
