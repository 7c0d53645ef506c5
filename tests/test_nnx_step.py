"""The chapter-5 step in Flax NNX, every form, against the pytree step (chapter 16).

Where flax is not installed, `pytest.importorskip` skips this module (the device run installs
it: scripts/device_run.py, setup).
"""

import jax
import numpy as np
import optax
import pytest

nnx = pytest.importorskip("flax.nnx")

import jaxloops  # noqa: E402
from conftest import normal  # noqa: E402
from jaxloops import equivalence, nnx_step  # noqa: E402
from jaxloops.data import Batch  # noqa: E402

SIZES = (13, 11, 7, 5)  # odd, distinct widths: a transposed kernel cannot pass
LR = 3e-3
# One optimizer for every test: the compiled steps (the pytree step below, nnx.jit's step,
# which keys on the optimizer) are reused across tests instead of compiled again for each.
TX = jaxloops.make_optimizer(LR, 1e-2)
PYTREE_STEP = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, TX))


def setup(steps=3, batch_size=9):
    params = jaxloops.init_mlp(jax.random.key(0), SIZES)
    # NumPy draws (no sampler compiled per shape), put on the device.
    x = normal((steps, batch_size, SIZES[0]), seed=1)
    y = np.random.default_rng(2).integers(0, SIZES[-1], (steps, batch_size), dtype=np.int32)
    return params, [jax.device_put(Batch(x[i], y[i])) for i in range(steps)], TX


def pytree_steps(params, batches):
    """The pytree step with TX, one step per batch."""
    opt_state = TX.init(params)
    for batch in batches:
        params, opt_state, _ = PYTREE_STEP(params, opt_state, batch)
    return params


def test_the_module_holds_the_pytree_and_computes_its_logits():
    params, batches, _ = setup()
    model = nnx_step.MLP(params)
    assert jax.tree.structure(nnx_step.to_pytree(model)) == jax.tree.structure(params)
    # Both compiled (one program each, not eager ops per shape): the same operations, so
    # the same bits.
    got = nnx.jit(lambda m, x: m(x))(model, batches[0].x)
    np.testing.assert_array_equal(got, jax.jit(jaxloops.mlp_logits)(params, batches[0].x))


@pytest.mark.parametrize("form", nnx_step.FORMS)
def test_every_form_ends_where_the_pytree_step_does(form):
    params, batches, tx = setup()
    got, want = nnx_step.nnx_steps(params, tx, batches, form), pytree_steps(params, batches)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_one_step_bound_passes_nnx_and_rejects_a_sign_flipped_step():
    params, batches, tx = setup(steps=1)
    grads = jax.jit(jax.grad(lambda p, b: jaxloops.mlp_loss(p, b)[0]))(params, batches[0])
    bound = equivalence.adam_step_bound(
        grads, equivalence.gradient_bound(jaxloops.mlp_loss, params, batches[0]), params,
        learning_rate=LR,
    )  # fmt: skip
    want = pytree_steps(params, batches)
    flipped = optax.chain(optax.scale(-1.0), tx)
    for form in nnx_step.FORMS:
        got = nnx_step.nnx_steps(params, tx, batches, form)
        assert equivalence.worst_ratio(got, want, bound) <= 1
        # Known-wrong, in every form: AdamW fed the gradient with its sign flipped.
        wrong = nnx_step.nnx_steps(params, flipped, batches, form)
        assert equivalence.worst_ratio(wrong, want, bound) > 1000


def test_every_loop_takes_the_same_steps():
    params, batches, tx = setup(steps=1)
    loops = nnx_step.form_loops(params, tx, batches[0], 2)
    losses = [float(run()) for run in loops.values()]
    assert list(loops) == ["pytree", *nnx_step.FORMS]
    assert len(set(losses)) == 1 and np.isfinite(losses[0])
    # A second call goes on from where the first stopped: the bound modules are updated too.
    again = [float(run()) for run in loops.values()]
    assert len(set(again)) == 1 and again[0] != losses[0]
    some = nnx_step.form_loops(params, tx, batches[0], 1, ["split/merge"])
    assert list(some) == ["pytree", "split/merge"]


def test_tree_mode_refuses_a_shared_variable_that_graph_mode_accepts():
    class Shared(nnx.Module):
        def __init__(self):
            self.first = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
            self.second = self.first  # one layer, reached by two names

        def __call__(self, x):
            return self.second(self.first(x))

    model, x = Shared(), np.ones((5, 3), np.float32)
    assert nnx.jit(lambda m, x: m(x))(model, x).shape == (5, 3)
    with pytest.raises(ValueError, match="Duplicate Param"):
        nnx.jit(lambda m, x: m(x), graph=False)(model, x)


def test_bad_inputs_are_refused():
    params, batches, tx = setup()
    with pytest.raises(ValueError, match="expected dense_0"):
        nnx_step.MLP({"dense_1": params["dense_1"]})
    with pytest.raises(ValueError, match="unknown form 'pmap'"):
        nnx_step.nnx_steps(params, tx, batches, "pmap")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        nnx_step.form_loops(params, tx, batches[0], 0)
    with pytest.raises(ValueError, match="unknown form 'nnx.vmap'"):
        nnx_step.form_step(params, tx, "nnx.vmap")
    with pytest.raises(ValueError, match=r"unknown forms \['pmap'\]"):
        nnx_step.form_loops(params, tx, batches[0], 1, ["split/merge", "pmap"])
