"""Chapter 16: the chapter-5 MLP and its train step in Flax NNX, in two forms.

`MLP` is an `nnx.Module` holding the same layers as `init_mlp`'s pytree, built from those
very arrays, so both start from identical values. The step is written once (`nnx_update`)
and compiled two ways: by `nnx.jit`, which takes the module and the optimizer as they are,
and by `jax.jit` around `nnx.merge` / `nnx.split`, where only a pytree of arrays crosses the
jit boundary.
"""

import jax
import optax
from flax import nnx

from jaxloops.data import Batch
from jaxloops.losses import cross_entropy


class MLP(nnx.Module):
    """The MLP of `init_mlp` as nnx.Linear layers, with ReLU between them, none after the
    last; `params` ({"dense_i": {"w": (F_i, F_i+1), "b": (F_i+1,)}}) gives every value
    (copied: a step that donates the module's arrays leaves `params` intact)."""

    def __init__(self, params):
        if not params or set(params) != {f"dense_{i}" for i in range(len(params))}:
            raise ValueError(f"params have layers {sorted(params)}; expected dense_0 .. dense_n")
        self.depth = len(params)
        for i in range(self.depth):
            w, b = params[f"dense_{i}"]["w"], params[f"dense_{i}"]["b"]
            layer = nnx.Linear(*w.shape, rngs=nnx.Rngs(0))  # (F_i, F_i+1); values replaced
            layer.kernel[...], layer.bias[...] = w.copy(), b.copy()  # a donating step may delete
            setattr(self, f"dense_{i}", layer)

    def __call__(self, x):  # (B, F_0) -> (B, C)
        for i in range(self.depth - 1):
            x = jax.nn.relu(getattr(self, f"dense_{i}")(x))
        return getattr(self, f"dense_{self.depth - 1}")(x)


def to_pytree(model: MLP) -> dict:
    """The module's weights as `init_mlp`'s dict: {"dense_i": {"w", "b"}}."""
    return {
        f"dense_{i}": {"w": layer.kernel[...], "b": layer.bias[...]}
        for i in range(model.depth)
        for layer in [getattr(model, f"dense_{i}")]
    }


def nnx_update(model: MLP, optimizer: nnx.Optimizer, batch: Batch) -> jax.Array:
    """One step, in place: the loss's gradient w.r.t. the module's Params, then the update.

    Returns:
      The loss before the step.
    """

    def loss_fn(model):
        return cross_entropy(model(batch.x), batch.y)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


# The module and optimizer go through nnx.jit as objects, their arrays donated, as every
# other form's state is: the new values are written back into them after the call.
nnx_jit_step = nnx.jit(nnx_update, donate_argnums=(0, 1))


def make_functional_step(model: MLP, optimizer: nnx.Optimizer):
    """The same step as a pure function of arrays, for `jax.jit`: split once here into a
    static graph definition and a state pytree; merged back inside the compiled function.

    Returns:
      (`step(state, batch) -> (state, loss)`, jitted with the state donated; the state).
    """
    graphdef, state = nnx.split((model, optimizer))

    def step(state, batch: Batch):
        model, optimizer = nnx.merge(graphdef, state)
        loss = nnx_update(model, optimizer, batch)
        return nnx.state((model, optimizer)), loss

    return jax.jit(step, donate_argnums=0), state


def functional_params(state) -> dict:
    """The weights in a functional step's state, as `init_mlp`'s dict."""
    model = state[0]
    return {
        name: {"w": model[name]["kernel"][...], "b": model[name]["bias"][...]}
        for name in model
        if name.startswith("dense_")
    }


def nnx_optimizer(model: MLP, tx: optax.GradientTransformation) -> nnx.Optimizer:
    """An nnx.Optimizer of `tx` over the module's Params (its weights and biases)."""
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


def form_loops(params, tx: optax.GradientTransformation, batch: Batch, steps: int) -> dict:
    """`steps` steps on one batch in each form, each loop `() -> its last loss`: the book's
    pytree step under `jax.jit`, the NNX step under `nnx.jit`, the same with the module and
    optimizer bound by `nnx.cached_partial` (Flax's cache of their graph traversal), and the
    functional NNX step under `jax.jit`. Every form donates its state, so none copies it."""
    from jaxloops.mlp import mlp_loss
    from jaxloops.train import make_train_step

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    pytree_step = jax.jit(make_train_step(mlp_loss, tx), donate_argnums=(0, 1))
    copy = lambda tree: jax.tree.map(lambda a: a.copy(), tree)
    pytree = [copy(params), tx.init(params)]
    model = MLP(params)
    optimizer = nnx_optimizer(model, tx)
    other = MLP(params)
    functional_step, state = make_functional_step(other, nnx_optimizer(other, tx))
    functional = [state]
    cached_model = MLP(params)
    cached_step = nnx.cached_partial(nnx_jit_step, cached_model, nnx_optimizer(cached_model, tx))

    def run_pytree():
        for _ in range(steps):
            pytree[0], pytree[1], metrics = pytree_step(*pytree, batch)
        return metrics["loss"]

    def run_nnx_jit():
        for _ in range(steps):
            loss = nnx_jit_step(model, optimizer, batch)
        return loss

    def run_cached():
        for _ in range(steps):
            loss = cached_step(batch)
        return loss

    def run_functional():
        for _ in range(steps):
            functional[0], loss = functional_step(functional[0], batch)
        return loss

    return {
        "pytree": run_pytree,
        "nnx.jit": run_nnx_jit,
        "nnx.cached_partial": run_cached,
        "split/merge": run_functional,
    }


def nnx_steps(params, tx: optax.GradientTransformation, batches, form: str) -> dict:
    """The weights after one step per batch in `form` ("nnx.jit" or "split/merge"), from a
    module built from `params`, as `init_mlp`'s dict."""
    if form not in ("nnx.jit", "split/merge"):
        raise ValueError(f"unknown form {form!r}; expected 'nnx.jit' or 'split/merge'")
    model = MLP(params)
    optimizer = nnx_optimizer(model, tx)
    if form == "nnx.jit":
        for batch in batches:
            nnx_jit_step(model, optimizer, batch)
        return to_pytree(model)
    step, state = make_functional_step(model, optimizer)
    for batch in batches:
        state, _ = step(state, batch)
    return functional_params(state)
