"""Chapter 16: the chapter-5 MLP and its train step in Flax NNX, in several forms.

`MLP` is an `nnx.Module` holding the same layers as `init_mlp`'s pytree, built from those
very arrays, so both start from identical values. The step is written once (`nnx_update`)
and compiled several ways (`FORMS`, `form_step`): by `nnx.jit`, which takes the module and
the optimizer as they are, in graph mode or tree mode (`graph=False`), with or without them
bound once (`nnx.cached_partial`, `nnx.jit_partial`); and by `jax.jit` around `nnx.merge` /
`nnx.split`, where only a pytree of arrays crosses the jit boundary.
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


# Tree mode: the module and optimizer cross nnx.jit as plain pytrees, flattened by JAX,
# without graph mode's walk that finds shared Variables (this MLP shares none).
tree_jit_step = nnx.jit(nnx_update, donate_argnums=(0, 1), graph=False)

# Every NNX form of the step that `form_step` builds, in the order the chapter shows them.
FORMS = (
    "nnx.jit",
    "nnx.cached_partial",
    "nnx.jit(graph=False)",
    "nnx.jit_partial(graph=False)",
    "split/merge",
)


def form_step(params, tx: optax.GradientTransformation, form: str):
    """One of `FORMS` on a fresh module built from `params`, each donating its state:

    - "nnx.jit": the module and optimizer passed as objects on every call (graph mode);
    - "nnx.cached_partial": the same step with them bound once and their graph walk cached;
    - "nnx.jit(graph=False)": passed as objects, flattened as pytrees (tree mode);
    - "nnx.jit_partial(graph=False)": bound once and flattened once (tree mode);
    - "split/merge": only their state, a pytree of arrays, crosses `jax.jit`.

    Returns:
      (`step(batch) -> loss`, `weights() -> init_mlp's dict` after the steps so far).
    """
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; expected one of {FORMS}")
    model = MLP(params)
    optimizer = nnx_optimizer(model, tx)
    if form == "split/merge":
        functional, state = make_functional_step(model, optimizer)
        held = [state]

        def step(batch):
            held[0], loss = functional(held[0], batch)
            return loss

        return step, lambda: functional_params(held[0])
    if form == "nnx.jit":
        step = lambda batch: nnx_jit_step(model, optimizer, batch)
    elif form == "nnx.jit(graph=False)":
        step = lambda batch: tree_jit_step(model, optimizer, batch)
    elif form == "nnx.cached_partial":
        step = nnx.cached_partial(nnx_jit_step, model, optimizer)
    else:  # the bound arguments are jit_partial's argument 0: donate them
        step = nnx.jit_partial(nnx_update, model, optimizer, donate_argnums=0, graph=False)
    return step, lambda: to_pytree(model)


def form_loops(
    params, tx: optax.GradientTransformation, batch: Batch, steps: int, forms=FORMS
) -> dict:
    """`steps` steps on one batch in each form, each loop `() -> its last loss`: the book's
    pytree step under `jax.jit` ("pytree"), then each of `forms` (some of `FORMS`, built by
    `form_step`). Every form donates its state, so none copies it."""
    from jaxloops.mlp import mlp_loss
    from jaxloops.train import make_train_step

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    unknown = [form for form in forms if form not in FORMS]
    if unknown:
        raise ValueError(f"unknown forms {unknown}; expected some of {FORMS}")
    pytree_step = jax.jit(make_train_step(mlp_loss, tx), donate_argnums=(0, 1))
    pytree = [jax.tree.map(lambda a: a.copy(), params), tx.init(params)]

    def run_pytree():
        for _ in range(steps):
            pytree[0], pytree[1], metrics = pytree_step(*pytree, batch)
        return metrics["loss"]

    def looped(step):
        def run():
            for _ in range(steps):
                loss = step(batch)
            return loss

        return run

    return {"pytree": run_pytree} | {f: looped(form_step(params, tx, f)[0]) for f in forms}


def nnx_steps(params, tx: optax.GradientTransformation, batches, form: str) -> dict:
    """The weights after one step per batch in `form` (one of `FORMS`), from a module built
    from `params`, as `init_mlp`'s dict."""
    step, weights = form_step(params, tx, form)
    for batch in batches:
        step(batch)
    return weights()
