"""The chapter-5 step in Flax NNX, both forms, against the pytree step (chapter 16).

The GPU machine's Python has no flax (it is not among the wheels carried to it:
scripts/fetch_wheels.sh), so `pytest.importorskip` skips this module in its suite.
"""

import jax
import numpy as np
import optax
import pytest

nnx = pytest.importorskip("flax.nnx")

import jaxloops  # noqa: E402
from jaxloops import equivalence, nnx_step  # noqa: E402
from jaxloops.data import Batch  # noqa: E402

SIZES = (13, 11, 7, 5)  # odd, distinct widths: a transposed kernel cannot pass
LR = 3e-3


def setup(steps=3, batch_size=9):
    params = jaxloops.init_mlp(jax.random.key(0), SIZES)
    x = jax.random.normal(jax.random.key(1), (steps, batch_size, SIZES[0]))
    y = jax.random.randint(jax.random.key(2), (steps, batch_size), 0, SIZES[-1])
    return params, [Batch(x[i], y[i]) for i in range(steps)], jaxloops.make_optimizer(LR, 1e-2)


def pytree_steps(params, tx, batches):
    step = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, tx))
    opt_state = tx.init(params)
    for batch in batches:
        params, opt_state, _ = step(params, opt_state, batch)
    return params


def test_the_module_holds_the_pytree_and_computes_its_logits():
    params, batches, _ = setup()
    model = nnx_step.MLP(params)
    assert jax.tree.structure(nnx_step.to_pytree(model)) == jax.tree.structure(params)
    np.testing.assert_array_equal(model(batches[0].x), jaxloops.mlp_logits(params, batches[0].x))


@pytest.mark.parametrize("form", ["nnx.jit", "split/merge"])
def test_both_forms_end_where_the_pytree_step_does(form):
    params, batches, tx = setup()
    got, want = nnx_step.nnx_steps(params, tx, batches, form), pytree_steps(params, tx, batches)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_one_step_bound_passes_nnx_and_rejects_a_sign_flipped_step():
    params, batches, tx = setup(steps=1)
    grads = jax.grad(lambda p: jaxloops.mlp_loss(p, batches[0])[0])(params)
    bound = equivalence.adam_step_bound(
        grads, equivalence.gradient_bound(jaxloops.mlp_loss, params, batches[0]), params,
        learning_rate=LR,
    )  # fmt: skip
    want = pytree_steps(params, tx, batches)
    for form in ("nnx.jit", "split/merge"):
        got = nnx_step.nnx_steps(params, tx, batches, form)
        assert equivalence.worst_ratio(got, want, bound) <= 1
    flipped = optax.chain(optax.scale(-1.0), tx)
    wrong = nnx_step.nnx_steps(params, flipped, batches, "nnx.jit")
    assert equivalence.worst_ratio(wrong, want, bound) > 1


def test_the_three_loops_take_the_same_steps():
    params, batches, tx = setup(steps=1)
    loops = nnx_step.form_loops(params, tx, batches[0], 2)
    losses = [float(run()) for run in loops.values()]
    assert list(loops) == ["pytree", "nnx.jit", "split/merge"]
    assert losses[0] == losses[1] == losses[2] and np.isfinite(losses[0])


def test_bad_inputs_are_refused():
    params, batches, tx = setup()
    with pytest.raises(ValueError, match="expected dense_0"):
        nnx_step.MLP({"dense_1": params["dense_1"]})
    with pytest.raises(ValueError, match="unknown form 'pmap'"):
        nnx_step.nnx_steps(params, tx, batches, "pmap")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        nnx_step.form_loops(params, tx, batches[0], 0)
