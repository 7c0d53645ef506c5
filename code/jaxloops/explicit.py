"""FSDP in explicit sharding mode: where a gradient is summed, written in the types.

In explicit mode (`jax.make_mesh`'s default axis type) an array's sharding is part of its
type (`jax.typeof(x)` prints `float32[64@data,256]`), and autodiff derives each cotangent's
type from its primal's. A weight gathered with `jax.reshard(w, jax.P(reduced={"data"}))` is
whole on every device but *reduced* over "data": its gradient comes back *unreduced*
(`{U:data}`: each device holds a partial sum, nothing sent yet), and the transpose of the
gather reshards that partial sum to the weight's shards, a reduce-scatter by its type.
Gathered plainly (`jax.P()`), the gradient is typed whole: summed on every device first.
"""

from collections.abc import Callable

import jax
from jax.sharding import Mesh, NamedSharding

DATA = "data"  # the mesh axis the batch and the parameters are split over


def gather(x, mesh: Mesh, *, reduced: bool = True):
    """`x` gathered whole on every device; with `reduced`, its gradient left unreduced over
    "data" until it is scattered back to `x`'s shards. JAX refuses an elementwise op between a
    reduced array and a batch-split one, so only matrices (used by a matmul) are reduced."""
    spec = jax.P(reduced={DATA}) if reduced and x.ndim >= 2 else jax.P()
    return jax.reshard(x, NamedSharding(mesh, spec))


def gathered(loss_fn: Callable, mesh: Mesh, *, reduced: bool = True) -> Callable:
    """FSDP's forward pass: the loss of the parameters gathered whole (see `gather`)."""

    def loss(params, batch):
        return loss_fn(jax.tree.map(lambda a: gather(a, mesh, reduced=reduced), params), batch)

    return loss


def gradient_types(loss_fn: Callable, params, batch) -> list[str]:
    """The types of the gradients that `loss_fn`'s backward pass computes for the parameters'
    matrices before it reshards them to the parameters' own placement: `{U:data}` marks one
    left unreduced (a partial sum on each device), no mark one summed whole on every device.

    Raises:
      ValueError: if `params` has no matrix (a leaf of two or more dimensions).
    """
    matrices = [a.shape for a in jax.tree.leaves(params) if len(a.shape) >= 2]
    if not matrices:
        shapes = [a.shape for a in jax.tree.leaves(params)]
        raise ValueError(f"params has no matrix: its leaves have shapes {shapes}")
    shapes = {*matrices, *(s[::-1] for s in matrices)}
    jaxpr = jax.make_jaxpr(jax.grad(lambda p, b: loss_fn(p, b)[0]))(params, batch)
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            aval = eqn.outvars[0].aval
            if aval.shape in shapes and "transpose" in str(eqn.source_info.name_stack):
                found.append(str(aval))
    return found


def per_layer_at(mesh: Mesh) -> Callable:
    """FSDP per layer for `fsdp.stack_loss`: `at(name, x)` gathers each weight (reduced) where
    it is used, inside the scanned layer; activations stay as they lie."""
    weights = ("w_in", "w1", "w2", "w_out")
    return lambda name, x: gather(x, mesh) if name in weights else x
