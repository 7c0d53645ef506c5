"""Losses and metrics on logits: one module, used by every model in the book."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


def known_value(x) -> np.ndarray | None:
    """`x` as a NumPy array when its value is known now; None while it is traced (under
    `jit`, `vmap` or `checkify`), where only a run-time check such as `check_labels` can see it.
    """
    try:
        value = np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None
    return None if value.dtype == object else value  # e.g. a jax.ShapeDtypeStruct: no value


def check_ids(ids, size: int, what: str) -> None:
    """Raises ValueError naming the first entry of `ids` outside [0, size), when the ids are
    known (an eager call); traced ids are left to `check_labels` under checkify."""
    ids = known_value(ids)
    if ids is None or ids.size == 0:
        return
    bad = (ids < 0) | (ids >= size)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{what} must be in [0, {size}); got {ids[first]} at index {first} "
            f"({int(bad.sum())} out of range, min {ids.min()}, max {ids.max()})"
        )


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy from logits (B, C) and integer labels (B,), stable for any scale.

    A label outside [0, C) raises ValueError when the labels are known (an eager call).
    Inside compiled code the labels are traced and nothing can raise: such a label's
    log-probability is then gathered out of bounds, which JAX fills with NaN, so the loss is
    NaN (a negative label too: it is not allowed to wrap around to class C + y).
    `checked_cross_entropy` under `checkify` raises there instead.
    """
    if jnp.ndim(logits) != 2 or jnp.shape(labels) != jnp.shape(logits)[:1]:
        raise ValueError(
            f"logits {jnp.shape(logits)} and labels {jnp.shape(labels)} must be (B, C) and (B,)"
        )
    C = logits.shape[-1]
    check_ids(labels, C, "labels")
    labels = jnp.where(labels < 0, C, labels)  # out of bounds, not wrapped: NaN, not a class
    log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # (B, C)
    picked = jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]  # (B,)
    return -picked.mean()


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Share of rows whose largest logit is the label."""
    if jnp.shape(labels) != jnp.shape(logits)[:-1]:  # (B, 1) labels would broadcast to (B, B)
        raise ValueError(
            f"labels {jnp.shape(labels)} must have the shape of logits {jnp.shape(logits)} "
            f"without its last (class) axis"
        )
    return (logits.argmax(axis=-1) == labels).mean()


def check_labels(labels: jax.Array, num_classes: int, what: str = "labels") -> None:
    """A run-time check, valid inside jit once functionalised by `checkify.checkify`,
    that every entry of `labels` is in [0, C); its message names the bad extremes."""
    checkify.check(
        jnp.all((labels >= 0) & (labels < num_classes)),
        f"{what} must be in [0, {num_classes}); got min {{lo}}, max {{hi}}",
        lo=labels.min(),
        hi=labels.max(),
    )


def checked_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """`cross_entropy` that checks its labels first. Under `jax.jit`, wrap the function that
    calls it in `checkify.checkify`: the check then becomes an error value to `.throw()`."""
    check_labels(labels, logits.shape[-1])
    return cross_entropy(logits, labels)


def chance_loss(logits) -> tuple[float, float]:
    """What `cross_entropy` should be for labels the logits know nothing about, to second
    order: ln C + sigma^2 / 2, sigma^2 the variance of a row's C logits (averaged over rows),
    as for independent normal logits. Returns (prediction, sigma^2); the prediction holds
    to within about sigma^2 / 4 while sigma^2 is small (sigma^2 <~ 2).
    """
    logits = np.asarray(logits, np.float64)  # (B, C)
    spread = float(logits.var(axis=-1).mean())
    return float(np.log(logits.shape[-1]) + spread / 2), spread
