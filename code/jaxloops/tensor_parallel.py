"""Tensor parallel on a 2-D `data x model` mesh: the Megatron split of each MLP layer, and
FSDP combined with it (chapter 12).

Each layer's first matrix w1 (D, F) is split by columns over "model" and its second, w2
(F, D), by rows: every device computes relu(h @ w1[:, its F / m]) with no communication,
multiplies by its rows of w2, and the m partial (B, D) products are summed by one
all-reduce over "model" (and, in the backward pass, one more for the gradient of h). The
batch is split over "data" as in data parallel; with FSDP the weights are split over "data"
as well and gathered, per layer, over "data" only.
"""

from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxloops.fsdp import stack_loss

DATA, MODEL = "data", "model"


def grid_mesh(shape: tuple[int, int], devices) -> Mesh:
    """A (data, model) mesh of Auto axes over exactly `devices`; shape's product must be
    their number."""
    devices = list(devices)
    if len(shape) != 2 or min(shape) < 1 or int(np.prod(shape)) != len(devices):
        raise ValueError(
            f"mesh shape {tuple(shape)} has {int(np.prod(shape))} places for "
            f"{len(devices)} devices; its product must be the device count"
        )
    auto = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh(tuple(shape), (DATA, MODEL), axis_types=auto, devices=devices)


def tp_specs(params, mesh: Mesh, *, fsdp: bool):
    """Where each weight lives: w1 split by columns (F) and w2 by rows (F) over "model";
    with `fsdp` also split over "data" (w1's D, w2's D, w_in's 64 inputs, w_out's D)."""
    hidden, m = params["layers"]["w1"].shape[2], mesh.shape[MODEL]
    if hidden % m:
        raise ValueError(f"the model axis of {m} devices does not divide the hidden width {hidden}")
    data = DATA if fsdp else None
    return {
        "w_in": jax.P(data, None),
        "layers": {"w1": jax.P(None, data, MODEL), "w2": jax.P(None, MODEL, data)},
        "w_out": jax.P(data, None),
    }


def tp_loss(mesh: Mesh) -> Callable:
    """The stacked MLP's loss with each weight and activation where the Megatron split puts
    it: weights whole over "data" where used (gathered there under FSDP), split over
    "model"; the hidden activations (B, F) split over both axes, the layer outputs (B, D)
    over "data" only, which is where the all-reduce over "model" comes from."""
    where = {
        "w_in": jax.P(),
        "w1": jax.P(None, MODEL),
        "w2": jax.P(MODEL, None),
        "w_out": jax.P(),
        "hidden": jax.P(DATA, MODEL),
        "h": jax.P(DATA, None),
    }
    at = lambda name, x: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, where[name]))
    return lambda params, batch: stack_loss(params, batch, at)


def held_blocks(sharding, shape) -> dict[tuple, list[int]]:
    """{(row start, row stop, column start, column stop): device ids holding that block} of
    a 2-D array of `shape` placed with `sharding`."""
    blocks: dict[tuple, list[int]] = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        rows, cols = (s.indices(size)[:2] for s, size in zip(index, shape, strict=True))
        blocks.setdefault((*rows, *cols), []).append(device.id)
    return blocks


def draw_layout(ax, sharding, shape, title: str) -> None:
    """A 2-D array as a rectangle, each block labelled with the devices that hold it."""
    import matplotlib.patches as patches

    for (r0, r1, c0, c1), ids in sorted(held_blocks(sharding, shape).items()):
        ax.add_patch(patches.Rectangle((c0, r0), c1 - c0, r1 - r0, fill=False, lw=1.2))
        label = ",".join(map(str, sorted(ids)))
        ax.text((c0 + c1) / 2, (r0 + r1) / 2, label, ha="center", va="center", fontsize=7)
    ax.set(xlim=(0, shape[1]), ylim=(shape[0], 0), title=title, xticks=[], yticks=[])
    ax.set_aspect("equal")
