"""The float32 rounding bounds accept a reordered computation and reject wrong ones."""

import jax
import numpy as np
import optax
import pytest

import jaxloops
from jaxloops import equivalence

B, CHUNKS, LR = 40, 8, 3e-3  # 8 chunks of 5 rows: the order in which 8 devices sum


@pytest.fixture(scope="module")
def setup(digits):
    # The data sliced, and the gradients combined, in NumPy (float32, the same operations in
    # the same order): eager ops per leaf shape would each compile a program.
    x, y = np.asarray(digits.train.x), np.asarray(digits.train.y)
    batch = jaxloops.Batch(x[:B], y[:B])
    params = jaxloops.init_mlp(jax.random.key(3), (64, 13, 7, 10))
    grad = jax.jit(jax.grad(lambda p, b: jaxloops.mlp_loss(p, b)[0]))
    g_one = jax.device_get(grad(params, batch))
    # The mean of 8 chunk means: the batch summed in another order, as the sharded step does.
    chunks = [jax.tree.map(lambda a, i=i: a[i::CHUNKS], batch) for i in range(CHUNKS)]
    g_chunked = jax.tree.map(
        lambda *g: sum(g) / CHUNKS, *[jax.device_get(grad(params, c)) for c in chunks]
    )
    shifted = jaxloops.Batch(x[1 : B + 1], y[1 : B + 1])
    bound = equivalence.gradient_bound(jaxloops.mlp_loss, params, batch)
    return dict(
        params=params, g_one=g_one, bound=bound,
        answers={
            "reordered": g_chunked,
            "negated": jax.tree.map(lambda g: -g, g_chunked),
            "zeroed": jax.tree.map(np.zeros_like, g_chunked),
            "shifted": jax.device_get(grad(params, shifted)),  # the data order off by one row
        },
    )  # fmt: skip


def test_a_reordered_sum_is_within_the_gradient_bound(setup):
    differs = jax.tree.leaves(jax.tree.map(lambda a, b: np.any(a != b), *[
        setup["g_one"], setup["answers"]["reordered"]]))  # fmt: skip
    assert any(differs)  # the order really changed the bits: the bound is tested, not idle
    assert (
        equivalence.worst_ratio(setup["answers"]["reordered"], setup["g_one"], setup["bound"]) <= 1
    )


@pytest.mark.parametrize("wrong", ["negated", "zeroed", "shifted"])
def test_the_gradient_bound_rejects_a_wrong_gradient(setup, wrong):
    ratio = equivalence.worst_ratio(setup["answers"][wrong], setup["g_one"], setup["bound"])
    assert ratio > 100, ratio


ANSWERS = [("reordered", True), ("negated", False), ("zeroed", False), ("shifted", False)]
OPTIMIZER = jaxloops.make_optimizer(LR, 1e-2)


@jax.jit  # one program for every case's two steps, not eager ops per leaf shape
def first_step(grad, params):
    """The parameters after one AdamW step from a fresh state with `grad`."""
    updates, _ = OPTIMIZER.update(grad, OPTIMIZER.init(params), params)
    return optax.apply_updates(params, updates)


@pytest.mark.parametrize(("answer", "accepted"), ANSWERS)
def test_the_step_bound_accepts_only_the_reordered_gradient(setup, answer, accepted):
    """One AdamW step from each gradient, against the step from the single device's."""
    params = setup["params"]
    step = lambda grad: first_step(grad, params)  # noqa: E731
    tolerance = equivalence.adam_step_bound(
        setup["g_one"], setup["bound"], params, learning_rate=LR
    )
    ratio = equivalence.worst_ratio(step(setup["answers"][answer]), step(setup["g_one"]), tolerance)
    assert (ratio <= 1) == accepted, ratio


def test_sum_bound_is_higham_gamma_and_refuses_void_counts():
    u = equivalence.UNIT_ROUNDOFF
    assert equivalence.sum_bound(2.0, 3) == pytest.approx(2 * 3 * u / (1 - 3 * u) * 2.0)
    with pytest.raises(ValueError, match=str(2**24)):
        equivalence.sum_bound(1.0, 2**24)


def test_worst_ratio_treats_a_zero_tolerance_as_exact():
    zero = {"a": np.zeros(3)}
    assert equivalence.worst_ratio(zero, zero, zero) == 0.0
    assert equivalence.worst_ratio({"a": np.array([0.0, 0.0, 1e-30])}, zero, zero) == np.inf
    assert equivalence.worst_ratio({"a": np.full(3, 2.0)}, zero, {"a": np.full(3, 4.0)}) == 0.5


@pytest.fixture(scope="module")
def scaled_logits(digits):
    # Parameters and inputs as NumPy (10 w rounds the same there), the three forward passes
    # one jitted program: no eager op per shape.
    params = jax.device_get(jaxloops.init_mlp(jax.random.key(0), (64, 256, 256, 10)))
    x = np.asarray(digits.train.x)[:200]
    logits_of = jax.jit(jaxloops.mlp_logits)
    logits = np.asarray(logits_of(params, x), np.float64)
    scaled = jax.tree.map(lambda w: 10 * w, params)
    other = jaxloops.init_mlp(jax.random.key(1), (64, 256, 256, 10))
    return dict(
        params=params, x=x, logits=logits,
        got=np.asarray(logits_of(scaled, x), np.float64),
        stale=np.asarray(logits_of(other, x), np.float64),
    )  # fmt: skip


def test_the_homogeneity_bound_accepts_the_scaled_network(scaled_logits):
    s = scaled_logits
    bound = equivalence.homogeneity_bound(s["params"], s["x"])
    assert np.all(np.abs(s["got"] - 1e3 * s["logits"]) <= bound)


@pytest.mark.parametrize("wrong", ["layers off by one", "negated", "stale", "largest logit +10 %"])
def test_the_homogeneity_bound_rejects_a_wrong_answer(scaled_logits, wrong):
    s = scaled_logits
    want = {
        "layers off by one": 1e2 * s["logits"],
        "negated": -1e3 * s["logits"],
        "stale": 1e3 * s["stale"],
        "largest logit +10 %": 1e3
        * s["logits"]
        * np.where(np.abs(s["logits"]) == np.abs(s["logits"]).max(), 1.1, 1.0),
    }[wrong]
    bound = equivalence.homogeneity_bound(s["params"], s["x"])
    assert np.any(np.abs(s["got"] - want) > bound)


def test_the_homogeneity_bound_refuses_biases_and_bad_factors(scaled_logits):
    s = scaled_logits
    biased = jax.tree.map(lambda a: a + 0.5 if a.ndim == 1 else a, s["params"])
    with pytest.raises(ValueError, match="0.5"):
        equivalence.homogeneity_bound(biased, s["x"])
    with pytest.raises(ValueError, match="-2"):
        equivalence.homogeneity_bound(s["params"], s["x"], factor=-2.0)
