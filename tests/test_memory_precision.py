"""Mixed precision and dynamic loss scaling (jaxloops.precision)."""

import jax
import jax.numpy as jnp
import optax
import pytest

import jaxloops
import memory_model
from conftest import SMALL_TRANSFORMER
from jaxloops import memory, precision

W = 2.0**-20  # a loss this small loses its float16 gradients to underflow


@pytest.fixture(scope="module")
def model():
    params, batch, _, _ = memory_model.model()
    return params, batch


def tiny_loss(params, batch):
    loss, aux = jaxloops.transformer_loss(params, batch)
    return W * loss, aux


def train(step, params, state, batch, steps=30):
    step = jax.jit(step)
    losses = []
    for _ in range(steps):
        params, state, metrics = step(params, state, batch)
        losses.append(float(metrics["loss"]) / W)
    return losses, state, metrics


def test_mixed_precision_keeps_float32_master_parameters_and_gradients(model):
    params, batch = model
    loss = precision.compute_in(jaxloops.transformer_loss, jnp.bfloat16)
    value, grads = jax.jit(jax.value_and_grad(lambda p: loss(p, batch)[0]))(params)
    assert value.dtype == jnp.float32
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    reference = jax.jit(jax.grad(lambda p: jaxloops.transformer_loss(p, batch)[0]))(params)
    # Close to float32 within bfloat16's rounding, and not identical: it did compute in bf16.
    error, scale = memory.max_error(reference, grads)
    assert 0 < error <= 64 * float(jnp.finfo(jnp.bfloat16).eps) * scale


def test_bytes_per_parameter_is_the_arithmetic_of_each_scheme(model):
    params, _ = model
    adamw = jaxloops.make_optimizer(1e-3, 0.1)
    count = memory.parameter_count(SMALL_TRANSFORMER)
    got = precision.bytes_per_parameter(params, adamw.init(params))
    assert got == pytest.approx(12 + 4 / count)  # params, mu, nu; Adam's int32 step count
    mixed = precision.bytes_per_parameter(params, adamw.init(params), compute_dtype=jnp.bfloat16)
    assert mixed == pytest.approx(14 + 4 / count)
    half = precision.cast_floats(params, jnp.bfloat16)
    assert precision.bytes_per_parameter(half, adamw.init(half)) == pytest.approx(6 + 4 / count)


def test_loss_scaling_recovers_a_run_that_float16_alone_loses(model):
    params, batch = model
    adam = optax.adam(1e-2, eps=1e-12)
    f32, _, _ = train(jaxloops.make_train_step(tiny_loss, adam), params, adam.init(params), batch)
    half_loss = precision.compute_in(tiny_loss, jnp.float16)
    g16, g32 = jax.jit(  # one program for both gradients
        lambda p: [jax.grad(lambda q, f=f: f(q, batch)[0])(p) for f in (half_loss, tiny_loss)]
    )(params)
    assert precision.zero_gradients(g16, g32) > memory.parameter_count(SMALL_TRANSFORMER) / 2
    f16, _, _ = train(jaxloops.make_train_step(half_loss, adam), params, adam.init(params), batch)
    scaled, (_, scale), _ = train(
        precision.make_scaled_step(half_loss, adam, growth_interval=10),
        params,
        (adam.init(params), precision.init_loss_scale(2.0**15)),
        batch,
    )
    assert f32[0] - f32[-1] > 1.0  # float32 learns this batch
    assert f16[0] - f16[-1] < 0.2 * (f32[0] - f32[-1])  # float16 alone barely moves
    assert abs(scaled[-1] - f32[-1]) < 0.1 * (f32[0] - f32[-1])  # scaled float16 follows float32
    assert float(scale.scale) >= 2.0**15


def test_a_non_finite_gradient_skips_the_step_and_halves_the_scale(model):
    params, batch = model
    adam = optax.adam(1e-2)
    step = jax.jit(
        precision.make_scaled_step(precision.compute_in(tiny_loss, jnp.float16), adam, 10)
    )
    state = (adam.init(params), precision.init_loss_scale(2.0**60))  # overflows float16
    new_params, (_, scale), metrics = step(params, state, batch)
    assert bool(metrics["skipped"])
    assert all(jax.tree.leaves(jax.tree.map(jnp.array_equal, new_params, params)))
    assert float(scale.scale) == 2.0**59 and int(scale.good_steps) == 0


def test_the_scale_doubles_after_a_run_of_good_steps():
    state = precision.init_loss_scale(8.0)
    for _ in range(2):
        state = precision.update_scale(state, jnp.bool_(True), growth_interval=3)
    assert float(state.scale) == 8.0 and int(state.good_steps) == 2
    state = precision.update_scale(state, jnp.bool_(True), growth_interval=3)
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
    reference = jnp.array([4.0, 3.0, 2.5, 2.0])
    assert precision.curve_gap(reference, reference * (1 + 2.0**-9)) == pytest.approx(2.0**-9)
    # One epoch out of step (the off-by-one a wrong data order gives) is far outside a
    # bfloat16 rounding.
    shifted = jnp.concatenate([reference[1:], reference[-1:]])
    assert precision.curve_gap(reference, shifted) > float(jnp.finfo(jnp.bfloat16).eps)
    with pytest.raises(ValueError, match=r"\(4,\) and \(3,\)"):
        precision.curve_gap(reference, reference[:3])
