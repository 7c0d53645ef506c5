"""Answers to the exercises of chapters 1-7; tests/test_solutions_loop.py checks each."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxloops.accumulate import make_accumulating_step
from jaxloops.data import Batch, epoch_batches
from jaxloops.train import decay_mask, make_optimizer


# Chapter 1.
def traced_shapes(fn, inputs) -> list[tuple[tuple[int, ...], str]]:
    """Calls `jax.jit(fn)` on each input; returns (shape, dtype) of the calls that traced `fn`.

    A Python side effect inside a jitted function runs while JAX traces it, not when the
    compiled program runs, so the list records exactly the cache misses.
    """
    traced = []

    def recorded(x):
        traced.append((tuple(x.shape), str(x.dtype)))  # runs at trace time only
        return fn(x)

    jitted = jax.jit(recorded)
    for x in inputs:
        jax.block_until_ready(jitted(x))
    return traced


# Chapter 2.
def ragged_compile_count(num_examples: int, batch_size: int) -> int:
    """Programs a jitted step compiles for one pass of `ragged_batches`: one per batch shape."""
    if not 0 < batch_size <= num_examples:
        raise ValueError(f"batch size {batch_size} must be in [1, {num_examples}] (the examples)")
    return 1 if num_examples % batch_size == 0 else 2


def epoch_example_counts(key: jax.Array, num_examples: int, batch_size: int) -> np.ndarray:
    """How often each example appears in one epoch of `epoch_batches`, shape (num_examples,)."""
    ids = np.arange(num_examples, dtype=np.int32)  # NumPy: jnp would compile per size
    data = jax.device_put(Batch(ids[:, None].astype(np.float32), ids))
    batches = epoch_batches(key, data, batch_size)
    return np.bincount(np.asarray(batches.y).ravel(), minlength=num_examples)


# Chapter 3.
def mlp_parameter_count(sizes) -> int:
    """Parameters of `init_mlp(key, sizes)`: a (F_i, F_i+1) matrix and a (F_i+1,) bias per layer."""
    return sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(sizes[:-1], sizes[1:]))


def label_smoothed_cross_entropy(
    logits: jax.Array, labels: jax.Array, smoothing: float
) -> jax.Array:
    """Mean cross-entropy (B, C), (B,) -> () against targets (1 - s) one_hot + s / C, stably."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    num_classes = logits.shape[-1]
    log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # (B, C)
    targets = (1.0 - smoothing) * jax.nn.one_hot(
        labels, num_classes
    ) + smoothing / num_classes  # (B, C)
    return -(targets * log_probs).sum(axis=-1).mean()


# Chapter 4.
def softmax_cross_entropy_grad(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Gradient of `cross_entropy` w.r.t. logits (B, C): (softmax(z) - one_hot(y)) / B."""
    batch, num_classes = logits.shape
    return (jax.nn.softmax(logits, axis=-1) - jax.nn.one_hot(labels, num_classes)) / batch


def momentum_update(params, grads, velocity, learning_rate: float, momentum: float):
    """One SGD-with-momentum step by hand: v <- g + momentum * v; p <- p - lr * v.

    Returns:
      (new params, new velocity); pass `jax.tree.map(jnp.zeros_like, params)` as the first velocity.
    """
    velocity = jax.tree.map(lambda v, g: g + momentum * v, velocity, grads)
    params = jax.tree.map(lambda p, v: p - learning_rate * v, params, velocity)
    return params, velocity


# Chapter 5.
def adamw_update(
    params,
    grads,
    state,
    learning_rate: float,
    weight_decay: float,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
):
    """One AdamW step by hand, decaying weight matrices only (`make_optimizer`'s rule).

    m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;
    m_hat = m / (1 - b1^t);  v_hat = v / (1 - b2^t)
    p <- p - lr (m_hat / (sqrt(v_hat) + eps) + wd * mask * p)

    Args:
      state: (t, m, v); start from `(0, zeros_like(params), zeros_like(params))`.
    Returns:
      (new params, new state).
    """
    t, m, v = state
    t = t + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)

    def step(p, m, v, decay):
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        return p - learning_rate * (m_hat / (jnp.sqrt(v_hat) + eps) + weight_decay * decay * p)

    params = jax.tree.map(step, params, m, v, decay_mask(params))
    return params, (t, m, v)


def make_clipped_optimizer(learning_rate: float, weight_decay: float, max_norm: float):
    """`make_optimizer`'s AdamW, after scaling gradients down to a global norm <= `max_norm`."""
    if max_norm <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    return optax.chain(
        optax.clip_by_global_norm(max_norm), make_optimizer(learning_rate, weight_decay)
    )


# Chapter 6.
def make_accumulating_train_step(loss_fn, optimizer, num_micro: int):
    """A train step that averages gradients over `num_micro` equal slices of the batch.

    Each slice's forward and backward pass runs inside a `lax.scan` (chapter 14's
    `accumulated_grads`), so activations are held for one slice at a time; the single
    optimizer update sees the mean gradient, which equals the full batch's for a mean loss.
    """
    return make_accumulating_step(loss_fn, optimizer, num_micro)


def host_syncs(num_steps: int, log_every: int | None) -> int:
    """Times `python_loop(..., log_every)` makes the host wait for the device over `num_steps`."""
    return 0 if log_every is None else math.ceil(num_steps / log_every)


# Chapter 7.
def precision_recall_f1(counts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class precision, recall and F1, each (C,), from a confusion matrix (rows: true class).

    A class never predicted (or never present) gets 0 where its denominator is 0, as scikit-learn's
    `zero_division=0` does.
    """
    counts = np.asarray(counts, dtype=np.float64)
    hits = np.diag(counts)
    predicted, present = counts.sum(axis=0), counts.sum(axis=1)
    precision = np.divide(hits, predicted, out=np.zeros_like(hits), where=predicted > 0)
    recall = np.divide(hits, present, out=np.zeros_like(hits), where=present > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(hits), where=total > 0)
    return precision, recall, f1


def top_k_accuracy(logits: jax.Array, labels: jax.Array, k: int, mask=None) -> jax.Array:
    """Share of unmasked rows of logits (B, C) whose label is among the k largest logits."""
    if not 0 < k <= logits.shape[-1]:
        raise ValueError(f"k = {k} must be in [1, {logits.shape[-1]}] (the classes)")
    _, top = jax.lax.top_k(logits, k)  # (B, k)
    hit = (top == labels[:, None]).any(axis=-1)  # (B,)
    weights = jnp.ones(hit.shape) if mask is None else mask.astype(jnp.float32)
    return (hit * weights).sum() / weights.sum()


# Chapter 5: the purity bug. A jitted function reads a Python global while it is traced;
# the compiled program keeps the value it saw, and changing the global later changes nothing.
LEARNING_RATE = 0.1


@jax.jit
def impure_sgd_step(params, grads):
    """SGD that reads the module global LEARNING_RATE: frozen at its first trace."""
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def frozen_global_demo(params, grads) -> tuple[jax.Array, jax.Array]:
    """Runs `impure_sgd_step` before and after setting LEARNING_RATE to 0, and returns
    (how far the first call moved the params, how far the second did): both the same."""
    global LEARNING_RATE
    moved = lambda new: sum(
        jnp.abs(a - b).sum() for a, b in zip(*map(jax.tree.leaves, (new, params)))
    )
    saved = LEARNING_RATE
    try:
        before = moved(impure_sgd_step(params, grads))
        LEARNING_RATE = 0.0  # should stop learning; the compiled program never sees it
        after = moved(impure_sgd_step(params, grads))
    finally:
        LEARNING_RATE = saved
    return before, after
