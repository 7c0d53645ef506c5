"""FSDP as it is practised (ZeRO-3): stacked layers, scanned, each layer's weights gathered
just before it runs and dropped after it.

The model is a residual MLP of L identical layers, D wide with hidden width F, between an
input projection (64 -> D) and a classifier (D -> C), stacked so that `jax.lax.scan` runs
one layer's program L times:

  params = {"w_in": (64, D), "layers": {"w1": (L, D, F), "w2": (L, F, D)}, "w_out": (D, C)}
  h = x @ w_in;  h = h + relu(h @ w1[l]) @ w2[l] for l < L;  logits = h @ w_out

Two forms of the same FSDP step:

  compiler-driven  each layer's shards are constrained to be replicated inside the scan
                   body; the partitioner inserts the gather and, for the gradient, its
                   transpose. `jax.checkpoint` drops the gathered weights after the layer,
                   so the backward pass gathers them again.
  shard_map twin   the same, per device, with `all_gather` forward and `psum_scatter`
                   (a reduce-scatter) for the gradient, written out in a `custom_vjp`.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from jaxloops.data import Batch
from jaxloops.losses import accuracy, cross_entropy

DATA = "data"


def init_stack(key, *, features: int, width: int, hidden: int, layers: int, classes: int):
    """Parameters of the stacked residual MLP (scaled normal weights, no biases)."""
    k_in, k1, k2, k_out = jax.random.split(key, 4)
    normal = lambda k, shape, fan_in: jax.random.normal(k, shape) / jnp.sqrt(fan_in)
    return {
        "w_in": normal(k_in, (features, width), features),  # (64, D)
        "layers": {
            "w1": normal(k1, (layers, width, hidden), width),  # (L, D, F)
            "w2": normal(k2, (layers, hidden, width), hidden) / layers,  # (L, F, D)
        },
        "w_out": normal(k_out, (width, classes), width),  # (D, C)
    }


WEIGHTS = ("w_in", "w1", "w2", "w_out")


def layer(h, w1, w2, at: Callable):
    """One residual MLP layer: h + relu(h @ w1) @ w2, h of shape (B, D); `at(name, x)` may
    constrain the hidden activations ("hidden") and the layer's output ("h")."""
    hidden = at("hidden", jax.nn.relu(h @ w1))  # (B, F)
    return at("h", h + hidden @ w2)  # (B, D)


def stack_loss(params, batch: Batch, at: Callable | None = None):
    """Cross-entropy of the stacked MLP.

    Args:
      at: `at(name, x)` returns x where it should be: applied to each weight ("w_in", "w1",
        "w2", "w_out") just before it is used and to the activations; default: as it lies.
    """
    at = (lambda name, x: x) if at is None else at

    @jax.checkpoint  # keeps only the layer's input: the gathered weights are not saved
    def body(h, weights):
        return layer(h, at("w1", weights["w1"]), at("w2", weights["w2"]), at), None

    h = batch.x @ at("w_in", params["w_in"])  # (B, D)
    h, _ = jax.lax.scan(body, h, params["layers"])
    logits = h @ at("w_out", params["w_out"])  # (B, C)
    return cross_entropy(logits, batch.y), {"accuracy": accuracy(logits, batch.y)}


def stack_specs():
    """FSDP's placement: every weight split over "data" along the first axis of the matrix a
    layer multiplies by (the 64 inputs of w_in, D of w1, F of w2, D of w_out)."""
    return {
        "w_in": jax.P(DATA, None),
        "layers": {"w1": jax.P(None, DATA, None), "w2": jax.P(None, DATA, None)},
        "w_out": jax.P(DATA, None),
    }


def per_layer_loss(mesh: Mesh) -> Callable:
    """Compiler-driven FSDP: each weight constrained to be whole on every device where it is
    used, inside the scan body; the partitioner gathers it there and nowhere else."""
    whole = NamedSharding(mesh, jax.P())
    gather = lambda name, x: jax.lax.with_sharding_constraint(x, whole) if name in WEIGHTS else x
    return lambda params, batch: stack_loss(params, batch, gather)


@jax.custom_vjp
def gather_shards(w):
    """The shards of `w` (split along axis 0 over "data") gathered whole on every device;
    its gradient is summed over the devices and scattered back to the shards."""
    return jax.lax.all_gather(w, DATA, axis=0, tiled=True)


def _gather_fwd(w):
    return gather_shards(w), None


def _gather_bwd(_, grad):
    # The transpose of a gather: sum every device's gradient, keep this device's rows.
    return (jax.lax.psum_scatter(grad, DATA, scatter_dimension=0, tiled=True),)


gather_shards.defvjp(_gather_fwd, _gather_bwd)


def shard_map_fsdp_grad(mesh: Mesh, specs) -> Callable:
    """The FSDP gradient written per device: each device sees B / n rows and its shards.

    Returns:
      grad(params, batch) -> the mean gradient, each leaf left in its shards.
    """
    n = mesh.shape[DATA]

    def local(params, batch):
        gather = lambda name, x: gather_shards(x) if name in WEIGHTS else x
        loss = lambda p: stack_loss(p, batch, gather)[0] / n  # per device: mean of B / n rows
        return jax.grad(loss)(params)

    return jax.shard_map(local, mesh=mesh, in_specs=(specs, jax.P(DATA)), out_specs=specs)
