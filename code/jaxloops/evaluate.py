"""Evaluation on fixed-size test batches: padding, masks, accuracy, confusion matrix."""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from jaxloops.data import Batch, check_batch_size, check_leading_axes
from jaxloops.losses import check_labels


class EvalBatches(NamedTuple):
    """Test data cut into equal batches; `mask` is False on the padding of the last one."""

    x: jax.Array  # (steps, B, F_in)
    y: jax.Array  # (steps, B)
    mask: jax.Array  # (steps, B) bool


def pad_batches(data: Batch, batch_size: int) -> EvalBatches:
    """Cuts `data` into equal batches, padding the last with copies of example 0, masked out.

    Every example lands in exactly one unmasked slot, and every batch has the same shape,
    so the evaluation step compiles once.
    """
    n = check_leading_axes(data)
    check_batch_size(batch_size, n)
    steps = -(-n // batch_size)  # ceil(n / B)
    pad = steps * batch_size - n
    index = np.concatenate([np.arange(n), np.zeros(pad, dtype=int)])
    mask = np.arange(steps * batch_size) < n
    stack = lambda a: jnp.asarray(a)[index].reshape(
        steps, batch_size, *a.shape[1:]
    )  # (n+pad, ...) -> (steps, B, ...)
    return EvalBatches(stack(data.x), stack(data.y), jnp.asarray(mask).reshape(steps, batch_size))


def confusion_matrix(
    labels: jax.Array, predictions: jax.Array, num_classes: int, mask=None
) -> jax.Array:
    """Counts (C, C): row = true class, column = predicted class; masked-out entries add 0.

    Unchecked, as scatters are in compiled code: an index >= C is dropped and a negative
    one wraps around (-1 counts as class C - 1). `checked_confusion_matrix` raises instead.
    """
    weights = jnp.ones(labels.shape, jnp.int32) if mask is None else mask.astype(jnp.int32)
    counts = jnp.zeros((num_classes, num_classes), jnp.int32)
    return counts.at[labels.ravel(), predictions.ravel()].add(weights.ravel())


def checked_confusion_matrix(
    labels: jax.Array, predictions: jax.Array, num_classes: int, mask=None
) -> jax.Array:
    """`confusion_matrix` that raises a ValueError naming the out-of-range extremes of the
    labels or predictions, checked inside the compiled program by `checkify`."""
    error, counts = _checked_counts(num_classes)(labels, predictions, mask)
    error.throw()
    return counts


@functools.lru_cache(maxsize=16)
def _checked_counts(num_classes: int):
    def counts(labels, predictions, mask):
        check_labels(labels, num_classes, "labels")
        check_labels(predictions, num_classes, "predictions")
        return confusion_matrix(labels, predictions, num_classes, mask)

    return jax.jit(checkify.checkify(counts))


@functools.partial(jax.jit, static_argnames=("logits_fn", "num_classes"))
def evaluate(logits_fn: Callable, params, batches: EvalBatches, num_classes: int):
    """Predictions and confusion matrix over all padded batches, in one scan on the device.

    Jitted with `logits_fn` and `num_classes` static: one compiled program per model
    function and shapes, reused by every later call (pass the same function object).

    Returns:
      (predictions (steps, B) int32, confusion matrix (C, C) int32).
    """

    def body(counts, batch):
        x, y, mask = batch
        logits = logits_fn(params, x)  # (B, C)
        if logits.shape[-1] != num_classes:  # a prediction >= C would drop out of the counts
            raise ValueError(
                f"logits_fn gives {logits.shape[-1]} classes, num_classes is {num_classes}"
            )
        predictions = logits.argmax(axis=-1)  # (B, C) -> (B,)
        return counts + confusion_matrix(y, predictions, num_classes, mask), predictions

    zeros = jnp.zeros((num_classes, num_classes), jnp.int32)
    counts, predictions = jax.lax.scan(body, zeros, tuple(batches))
    return predictions, counts


def check_counts(counts) -> np.ndarray:
    """`counts` as a NumPy (C, C) matrix; ValueError unless square with something counted."""
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1]:
        raise ValueError(f"a confusion matrix is square (C, C), got shape {counts.shape}")
    if counts.sum() <= 0:  # every share would be 0 / 0
        raise ValueError(f"the confusion matrix counts {counts.sum()} examples; need >= 1")
    return counts


def accuracy_from_confusion(counts) -> float:
    """Share of examples on the diagonal."""
    counts = check_counts(counts)
    return float(np.trace(counts) / counts.sum())


def per_class_accuracy(counts) -> np.ndarray:
    """Recall of each class: diagonal over row sums, shape (C,); NaN for a class that has no
    examples (its recall is undefined)."""
    counts = check_counts(counts)
    rows = counts.sum(axis=1)
    return np.diag(counts) / np.where(rows > 0, rows, np.nan)


def most_confused(counts, k: int) -> list[tuple[int, int, int]]:
    """The k largest off-diagonal cells as (true class, predicted class, count), largest first."""
    if k < 0:  # a negative k would slice off the end instead: all but the smallest -k cells
        raise ValueError(f"k must be >= 0, got {k}")
    off = np.asarray(counts).copy()
    np.fill_diagonal(off, 0)
    order = np.argsort(off, axis=None)[::-1][:k]
    pairs = [(int(t), int(p), int(off[t, p])) for t, p in zip(*np.unravel_index(order, off.shape))]
    return [pair for pair in pairs if pair[2] > 0]
