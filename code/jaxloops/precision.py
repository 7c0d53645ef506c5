"""Mixed precision: compute in a 16-bit type, keep float32 master parameters, and dynamic
loss scaling so that float16 gradients do not underflow to zero."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxloops.train import LossFn


def cast_floats(tree, dtype):
    """Every floating-point leaf of `tree` cast to `dtype`; integer leaves unchanged."""
    return jax.tree.map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree
    )


def compute_in(loss_fn: LossFn, dtype) -> LossFn:
    """`loss_fn` run on a `dtype` copy of the parameters; loss and metrics in float32.

    The gradient with respect to the (float32) parameters flows back through the cast, so
    it arrives in float32: the optimizer and its state never see the 16-bit copy.
    """

    def loss(params, batch):
        value, aux = loss_fn(cast_floats(params, dtype), batch)
        return value.astype(jnp.float32), cast_floats(aux, jnp.float32)

    return loss


def bytes_per_parameter(params, opt_state, compute_dtype=None) -> float:
    """Bytes the step's state holds per parameter: the parameters, the optimizer state,
    and (for mixed precision) the `compute_dtype` copy of the parameters made in each step."""
    leaves = jax.tree.leaves(params)
    count = sum(a.size for a in leaves)
    state = sum(a.size * a.dtype.itemsize for a in leaves + jax.tree.leaves(opt_state))
    copy = 0 if compute_dtype is None else count * jnp.dtype(compute_dtype).itemsize
    return (state + copy) / count


class LossScale(NamedTuple):
    """Dynamic loss scaling's state: the scale (a power of two) and the finite steps since
    it last changed."""

    scale: jax.Array  # float32 scalar
    good_steps: jax.Array  # int32 scalar


def init_loss_scale(scale: float = 2.0**15) -> LossScale:
    """The initial state; `scale` must be a positive power of two, so that scaling and
    unscaling change only the exponent and round nothing."""
    is_power = (
        isinstance(scale, (int, float))
        and scale > 0
        and float(scale).hex().startswith("0x1.0000000000000p")
    )
    if not is_power:
        raise ValueError(f"loss scale must be a positive power of two, got {scale!r}")
    return LossScale(jnp.float32(scale), jnp.int32(0))


def all_finite(tree) -> jax.Array:
    """True when every entry of every leaf is finite (no inf, no NaN)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)]))


def update_scale(state: LossScale, finite, growth_interval: int) -> LossScale:
    """Halve the scale after a non-finite gradient; double it after `growth_interval`
    finite steps in a row."""
    grow = finite & (state.good_steps + 1 >= growth_interval)
    scale = jnp.where(finite, jnp.where(grow, state.scale * 2, state.scale), state.scale / 2)
    good = jnp.where(finite & ~grow, state.good_steps + 1, 0)
    return LossScale(scale.astype(jnp.float32), good.astype(jnp.int32))


def make_scaled_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, growth_interval=50):
    """A train step with dynamic loss scaling; its optimizer state is (optax state, LossScale).

    The loss is multiplied by the scale before the backward pass, the gradients divided by it
    after; a step whose gradients are not all finite is skipped (parameters and optimizer
    state unchanged) and the scale halved.
    """
    if not isinstance(growth_interval, int) or growth_interval < 1:
        raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")

    def scaled(params, batch, scale):
        loss, aux = loss_fn(params, batch)
        return loss * scale, (loss, aux)

    def train_step(params, state, batch):
        opt_state, loss_scale = state
        grads, (loss, aux) = jax.grad(scaled, has_aux=True)(params, batch, loss_scale.scale)
        grads = jax.tree.map(lambda g: g / loss_scale.scale, grads)
        finite = all_finite(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree.map(  # noqa: E731
            lambda n, o: jnp.where(jnp.broadcast_to(finite, jnp.shape(n)), n, o), new, old
        )
        params, opt_state = keep(new_params, params), keep(new_opt_state, opt_state)
        metrics = {"loss": loss, **aux, "scale": loss_scale.scale, "skipped": ~finite}
        return params, (opt_state, update_scale(loss_scale, finite, growth_interval)), metrics

    return train_step


def zero_gradients(grads, reference) -> int:
    """Entries that are exactly 0 in `grads` but not in `reference` (lost to underflow)."""
    # Counted in NumPy on the host: eager jnp would compile programs for every leaf shape.
    return int(
        sum(
            np.sum((np.asarray(g) == 0) & (np.asarray(r) != 0))
            for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference))
        )
    )


def curve_gap(reference, other) -> float:
    """The largest relative gap max |other - reference| / |reference| between two loss
    curves of the same length (e.g. per-epoch means of two runs)."""
    # In NumPy on the host (float32, as before): eager jnp would compile per curve length.
    reference, other = np.asarray(reference, np.float32), np.asarray(other, np.float32)
    if reference.shape != other.shape:
        raise ValueError(f"curves of different lengths: {reference.shape} and {other.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):  # a 0 gives inf or NaN, as jnp does
        return float(np.max(np.abs(other - reference) / np.abs(reference)))
