"""The same train step on many devices: a mesh, where each array lives, and what it costs.

Two strategies over one mesh axis, `"data"`, of size n:

  data parallel  the batch is split over n devices, parameters and optimizer state are
                 replicated; the gradients are averaged with one all-reduce.
  FSDP           the batch is split as above, and so are parameters and optimizer state
                 (each leaf along its first dimension divisible by n); the parameters are
                 all-gathered before the forward pass, the gradients reduced back to shards.

Both reuse `make_train_step` and `fit` unchanged: a strategy is a placement of the arguments
plus a sharding constraint on the batch, not a second train step.
"""

import socket
import subprocess
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxloops import processes
from jaxloops.data import Batch
from jaxloops.loop import fit
from jaxloops.mlp import init_mlp, mlp_loss
from jaxloops.train import make_optimizer, make_train_step

DATA = "data"  # the mesh axis the batch (and, for FSDP, the parameters) is split over


def data_mesh(num_devices: int, devices, *, explicit: bool = False) -> Mesh:
    """A one-axis mesh ("data",) over the first `num_devices` of `devices`.

    Args:
      devices: the devices to choose from, always named by the caller: `jax.devices("cpu")`
        for simulated CPU devices, `jax.devices()` for the default backend's (under
        `jax.distributed`, all processes' devices).
      explicit: Explicit axis type (shardings are part of `jax.typeof`) instead of Auto.
    """
    devices = list(devices)
    if not 0 < num_devices <= len(devices):
        raise ValueError(
            f"a mesh of {num_devices} devices needs {num_devices} devices; "
            f"{len(devices)} are available"
        )
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    return jax.make_mesh((num_devices,), (DATA,), axis_types=(kind,), devices=devices[:num_devices])


def check_spec(shape: tuple[int, ...], spec: jax.P, mesh: Mesh) -> None:
    """Raises ValueError if `spec` splits a dimension of `shape` into unequal parts."""
    if len(spec) > len(shape):
        raise ValueError(f"spec {spec} has {len(spec)} entries for an array of shape {shape}")
    for dim, axes in enumerate(spec):
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        parts = int(np.prod([mesh.shape[name] for name in names]))
        if shape[dim] % parts:
            raise ValueError(
                f"dimension {dim} of shape {shape} has size {shape[dim]}, not divisible by "
                f"the {parts} devices of mesh axes {names}"
            )


def check_batch(batch, mesh: Mesh) -> None:
    """Raises ValueError unless the global batch splits evenly over the "data" axis."""
    rows, n = jax.tree.leaves(batch)[0].shape[0], mesh.shape[DATA]
    if rows % n:
        raise ValueError(f"global batch of {rows} is not divisible by the {n} devices of {DATA!r}")


def fsdp_spec(shape: tuple[int, ...], axis_size: int) -> jax.P:
    """Splits the first dimension divisible by `axis_size`; replicates a leaf with none."""
    for dim, size in enumerate(shape):
        if size % axis_size == 0:
            return jax.P(*([None] * dim), DATA)
    return jax.P()


def strategy_specs(tree, strategy: str, mesh: Mesh):
    """PartitionSpecs for parameters or optimizer state: "dp" replicates, "fsdp" splits."""
    if strategy == "dp":
        return jax.tree.map(lambda a: jax.P(), tree)
    if strategy == "fsdp":
        return jax.tree.map(lambda a: fsdp_spec(a.shape, mesh.shape[DATA]), tree)
    raise ValueError(f"unknown strategy {strategy!r}; expected 'dp' or 'fsdp'")


def place(mesh: Mesh, specs, local_tree, global_shapes=None):
    """Global arrays from this process's part of each leaf (on one process: the whole leaf).

    Args:
      specs: a PartitionSpec per leaf.
      local_tree: host arrays; under several processes, each holds its own rows of a split
        leaf and a full copy of a replicated one.
      global_shapes: the leaves' global shapes (default: the local shapes).
    """
    local_leaves, treedef = jax.tree.flatten(local_tree)
    spec_leaves = treedef.flatten_up_to(specs)
    shapes = [None] * len(local_leaves) if global_shapes is None else global_shapes
    arrays = []
    for local, spec, shape in zip(local_leaves, spec_leaves, shapes, strict=True):
        local = np.asarray(local)
        shape = local.shape if shape is None else tuple(shape)
        check_spec(shape, spec, mesh)
        sharding = NamedSharding(mesh, spec)
        arrays.append(jax.make_array_from_process_local_data(sharding, local, shape))
    return treedef.unflatten(arrays)


def sharded_step(train_step: Callable, mesh: Mesh, param_specs, opt_specs) -> Callable:
    """The same train step, its batch split over "data" and its state kept where it lives.

    The constraints are the whole strategy: the compiler partitions the step to match them
    and inserts the collectives. Build it once and hand it to `fit`, like any train step.
    """
    named = lambda specs: jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    params_at, opt_at = named(param_specs), named(opt_specs)

    def step(params, opt_state, batch):
        check_batch(batch, mesh)
        batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, jax.P(DATA)))
        params, opt_state, metrics = train_step(params, opt_state, batch)
        params = jax.lax.with_sharding_constraint(params, params_at)
        opt_state = jax.lax.with_sharding_constraint(opt_state, opt_at)
        return params, opt_state, metrics

    return step


def gathered(loss_fn: Callable, mesh: Mesh) -> Callable:
    """FSDP's forward pass: the loss of the parameters all-gathered to every device.

    Differentiating through the gather sends each gradient back to its shard.
    """
    replicated = NamedSharding(mesh, jax.P())

    def loss(params, batch):
        return loss_fn(jax.lax.with_sharding_constraint(params, replicated), batch)

    return loss


def pmean_loss(loss_fn: Callable, axis: str = DATA) -> Callable:
    """Per-device loss averaged over `axis` with an explicit `pmean` (for `shard_map`).

    The parameters are the same on every device, so differentiating the mean over devices
    all-reduces the gradients: the transpose of a replicated input is a sum.
    """

    def loss(params, batch):
        return jax.lax.pmean(loss_fn(params, batch), axis)

    return loss


def shard_map_grad(loss_fn: Callable, mesh: Mesh, *, mean: bool) -> Callable:
    """The gradient per device with `shard_map`, parameters in replicated: with `mean`, of
    the loss averaged over devices by `pmean`; without, of each device's own loss.

    Either way autodiff all-reduces the gradient: the transpose of using a replicated input
    on every device is a sum over the devices. `pmean` adds only the 1 / n.
    """
    device_loss = pmean_loss(loss_fn) if mean else loss_fn
    grad = jax.grad(lambda params, batch: device_loss(params, batch)[0])
    return jax.shard_map(grad, mesh=mesh, in_specs=(jax.P(), jax.P(DATA)), out_specs=jax.P())


def shard_map_step(loss_fn: Callable, optimizer, mesh: Mesh) -> Callable:
    """Data parallel written per device: each device's step sees B / n rows of the batch."""
    step = jax.shard_map(
        make_train_step(pmean_loss(loss_fn), optimizer),
        mesh=mesh,
        in_specs=(jax.P(), jax.P(), jax.P(DATA)),
        out_specs=(jax.P(), jax.P(), jax.P()),
    )

    def checked(params, opt_state, batch):
        check_batch(batch, mesh)
        return step(params, opt_state, batch)

    return checked


def fit_data_parallel(key, mesh: Mesh, train_local, examples: int, sizes):
    """Data-parallel training of the digits MLP with the book's `fit`, on one or more processes.

    Args:
      train_local: this process's rows of the training set (a `Batch` of host arrays); on one
        process, all `examples` rows.
      examples: rows of the global training set, divisible by the mesh.
      sizes: a `ShardingSizes` (hidden widths, batch size, epochs, optimizer).
    Returns:
      (params, opt_state, History), the state replicated on every device of `mesh`.
    """
    init_key, data_key = jax.random.split(key)
    # Initialised on a device of the mesh, so on every process and in every kernel with the
    # same backend's arithmetic (another backend may round the normal draws differently).
    local = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
    with jax.default_device(local):
        params = jax.device_get(init_mlp(init_key, sizes.widths))
    optimizer = make_optimizer(sizes.learning_rate, sizes.weight_decay)
    param_specs = strategy_specs(params, "dp", mesh)
    opt_specs = strategy_specs(jax.eval_shape(optimizer.init, params), "dp", mesh)
    params = place(mesh, param_specs, params)
    opt_state = jax.jit(optimizer.init, out_shardings=NamedSharding(mesh, jax.P()))(params)
    step = sharded_step(make_train_step(mlp_loss, optimizer), mesh, param_specs, opt_specs)
    rows = Batch(jax.P(DATA), jax.P(DATA))
    shapes = [(examples, 64), (examples,)]
    data = place(mesh, rows, train_local, global_shapes=shapes)
    # Every process passes the same key: a replicated global array, like the parameters.
    data_key = jax.random.wrap_key_data(place(mesh, jax.P(), jax.random.key_data(data_key)))
    return fit(
        data_key, params, opt_state, step, data, batch_size=sizes.batch_size, epochs=sizes.epochs
    )


def device_bytes(tree, device=None) -> int:
    """Bytes of `tree`'s leaves held by one device (default: the first of the first leaf)."""
    leaves = jax.tree.leaves(tree)
    device = leaves[0].sharding._device_assignment[0] if device is None else device
    return sum(s.data.nbytes for a in leaves for s in a.addressable_shards if s.device == device)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def no_tcp_reason() -> str | None:
    """Why `run_processes` cannot run on this machine, or None where it can: its processes
    join through `jax.distributed` over TCP on localhost, and some machines (the TPU machine
    this book borrows) allow no TCP socket, not even on the loopback. A connection is tried:
    a loopback that is down (the CPU rehearsal of that machine) still lets a socket bind."""
    try:
        with socket.socket() as server, socket.socket() as client:
            server.bind(("localhost", 0))
            server.listen()
            client.settimeout(5)
            client.connect(server.getsockname())
    except OSError as e:
        return f"no TCP on this machine's loopback ({e}); jax.distributed joins processes over TCP"
    return None


def run_processes(out_dir, *, num_processes: int, devices_per_process: int, sizes, save=None):
    """Launches `python -m jaxloops.workers.sharding` once per process on localhost.

    Each worker starts JAX on the CPU with `devices_per_process` devices, joins the others
    through `jax.distributed.initialize`, trains data parallel with `fit` at `sizes` (a
    `ShardingSizes`) and process 0 writes the parameters to `out_dir/params.npz`; with
    `save` (a directory), all processes then save one orbax checkpoint there together.

    Returns:
      The parameters and ("opt_state. ...") the optimizer state, named as
      `checkpoint.flat_arrays` names them, and "loss" per epoch.
    """
    port, part = _free_port(), processes.sizes_json(sharding=sizes)
    common = [f"--port={port}", f"--processes={num_processes}", f"--sizes={part}"]
    common += [f"--devices={devices_per_process}", f"--out={out_dir}"]
    common += [] if save is None else [f"--checkpoint={save}"]
    # Each process compiles its own programs: under JAX 0.12.1 a process that loaded them
    # from the persistent compilation cache aborted the run (0.10.2 and 0.12.0 did not).
    env = {**processes.cpu_env(devices_per_process), "JAX_ENABLE_COMPILATION_CACHE": "false"}
    running = [
        subprocess.Popen(
            processes.command("sharding", f"--process={i}", *common),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(num_processes)
    ]
    logs = [p.communicate(timeout=300)[0] for p in running]
    for i, (p, log) in enumerate(zip(running, logs)):
        if p.returncode:
            raise RuntimeError(f"process {i} exited with {p.returncode}:\n{log[-3000:]}")
    with np.load(f"{out_dir}/params.npz") as f:
        return dict(f)
