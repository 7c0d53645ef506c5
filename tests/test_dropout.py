import dataclasses
import math

import jax
import numpy as np
import pytest

from conftest import SMALL_TRANSFORMER
from jaxloops.data import Batch
from jaxloops.dropout import dropout, make_dropout_train_step
from jaxloops.train import make_optimizer, make_train_step
from jaxloops.transformer import TransformerConfig, transformer_loss

# The training loss at rate 0.25, compiled once for the tests that evaluate it.
NOISY_LOSS = jax.jit(lambda p, b, k: transformer_loss(p, b, dropout_rate=0.25, key=k)[0])


@pytest.fixture(scope="module")
def batch():
    tokens = np.random.default_rng(3).integers(0, 13, (7, 10), dtype=np.int32)
    return jax.device_put(Batch(x=tokens[:, :-1], y=tokens[:, 1:]))  # a copy, not a program


@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5, float("nan")])
def test_a_rate_outside_zero_one_raises(rate, small_transformer, batch):
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        dataclasses.replace(SMALL_TRANSFORMER, dropout_rate=rate)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        transformer_loss(small_transformer, batch, dropout_rate=rate, key=jax.random.key(0))


def test_the_default_rate_is_zero_and_a_positive_rate_needs_a_key(small_transformer, batch):
    assert TransformerConfig(13, 2, 30, 10, 5, 21, 11).dropout_rate == 0.0
    with pytest.raises(ValueError, match="needs a key"):
        transformer_loss(small_transformer, batch, dropout_rate=0.25)


def test_dropout_zeroes_the_rate_and_keeps_the_mean():
    x = np.ones((200_000,), np.float32)
    # One program (jitted), not an eager op per step of the function: the same masks.
    y = np.asarray(jax.jit(dropout, static_argnums=1)(x, 0.3, jax.random.key(0)))
    n = y.size
    # Zeros ~ Binomial(n, 0.3): 5 standard deviations either side.
    assert abs((y == 0).mean() - 0.3) < 5 * math.sqrt(0.3 * 0.7 / n)
    np.testing.assert_allclose(y[y != 0], 1 / 0.7, rtol=1e-6)
    assert dropout(x, 0.0, None) is x


def test_evaluation_without_dropout_is_deterministic(small_transformer, batch):
    loss = jax.jit(lambda p, b: transformer_loss(p, b)[0])
    first, second = loss(small_transformer, batch), loss(small_transformer, batch)
    assert float(first) == float(second)
    a, b = (
        NOISY_LOSS(small_transformer, batch, jax.random.key(1)),
        NOISY_LOSS(small_transformer, batch, jax.random.key(2)),
    )
    assert float(a) != float(b) and float(a) != float(first)  # training draws masks


def test_the_step_key_is_folded_from_the_optimizers_counter(small_transformer, batch):
    optimizer = make_optimizer(1e-3, 0.1)
    state = jax.jit(optimizer.init)(small_transformer)  # one program, not one per leaf
    key = jax.random.key(5)
    step = jax.jit(make_dropout_train_step(transformer_loss, optimizer, key, 0.25))
    _, state_1, metrics_0 = step(small_transformer, state, batch)
    _, _, again = step(small_transformer, state, batch)  # the same counter: the same masks
    _, _, metrics_1 = step(small_transformer, state_1, batch)  # counter 1: other masks
    want = NOISY_LOSS(small_transformer, batch, jax.random.fold_in(key, 0))  # rate 0.25
    assert float(metrics_0["loss"]) == float(again["loss"])
    np.testing.assert_allclose(metrics_0["loss"], want, rtol=1e-6)
    assert float(metrics_1["loss"]) != float(metrics_0["loss"])
    # At rate 0 it is chapter 5's step.
    plain = make_dropout_train_step(transformer_loss, optimizer, key, 0.0)
    reference = make_train_step(transformer_loss, optimizer)
    got, want = (
        jax.jit(plain)(small_transformer, state, batch),
        jax.jit(reference)(small_transformer, state, batch),
    )
    assert float(got[2]["loss"]) == float(want[2]["loss"])
