"""Chapter 12's checks on 8 CPU devices, run by tests/test_sharding.py in a process of its own.

Started with `workers.cpu_env(8)`: the CPU platform with 8 devices, whatever the default
backend of the test process. Prints one line, "REPORT" + JSON of what it measured.
"""

import json
import sys
import warnings

# Our deprecated JAX calls fail the probe; a library's (orbax 0.12.8 reads
# jax.sharding.SingleDeviceSharding, deprecated in JAX 0.12.1) is its own to fix.
warnings.filterwarnings("error", category=DeprecationWarning, module=r"(jaxloops|__main__)")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxloops  # noqa: E402
from jaxloops import equivalence, fsdp, measure, sharding, tensor_parallel, workers  # noqa: E402
from jaxloops.measure import comms  # noqa: E402

# Sized for a test: odd widths, B = 40 = 5 rows per device, two short epochs.
SIZES = jaxloops.sizes.ShardingSizes(
    devices=8, hidden=(24, 16), batch_size=40, examples=160, epochs=2,
    learning_rate=3e-3, weight_decay=1e-2,
    stack_layers=3, stack_width=40, stack_hidden=24, stack_batch=40, grid=(4, 2),
)  # fmt: skip
ROWS = jaxloops.Batch(jax.P("data"), jax.P("data"))


def steps(mesh, optimizer):
    """name -> (sharded train step, placement kind) for each strategy and each mutant."""
    loss = jaxloops.mlp_loss
    negated = lambda p, b: jax.tree.map(lambda a: -a, loss(p, b))  # sign-flipped gradient
    zeroed = lambda p, b: jax.tree.map(lambda a: 0 * a, loss(p, b))  # zero gradient
    make = lambda fn: jaxloops.make_train_step(fn, optimizer)
    return {
        "dp": (make(loss), "dp"),
        "fsdp": (make(sharding.gathered(loss, mesh)), "fsdp"),
        "shard_map": (None, "dp"),
        "negated": (make(negated), "dp"),
        "zeroed": (make(zeroed), "dp"),
        "shifted": (make(loss), "dp"),  # fed the batch one row later: off-by-one data order
    }


def strategies(report, mesh, params, opt_state, batch, shifted, optimizer):
    """Each strategy's step: collectives, bytes, and how far it is from one device's."""
    grad_fn = jax.jit(jax.grad(lambda p, b: jaxloops.mlp_loss(p, b)[0]))
    g_one = jax.device_get(grad_fn(params, batch))
    g_bound = equivalence.gradient_bound(jaxloops.mlp_loss, params, batch)
    step_bound = equivalence.adam_step_bound(
        g_one, g_bound, params, learning_rate=SIZES.learning_rate
    )
    one = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, optimizer))(params, opt_state, batch)
    param_bytes = int(sum(a.nbytes for a in jax.tree.leaves(params)))
    for name, (train_step, kind) in steps(mesh, optimizer).items():
        p_specs = jaxloops.strategy_specs(params, kind, mesh)
        o_specs = jaxloops.strategy_specs(opt_state, kind, mesh)
        if train_step is None:
            sharded = jaxloops.shard_map_step(jaxloops.mlp_loss, optimizer, mesh)
        else:
            sharded = jaxloops.sharded_step(train_step, mesh, p_specs, o_specs)
        rows = shifted if name == "shifted" else batch
        args = (sharding.place(mesh, p_specs, params), sharding.place(mesh, o_specs, opt_state),
                sharding.place(mesh, ROWS, rows))  # fmt: skip
        compiled = jax.jit(sharded).lower(*args).compile()
        new = jax.device_get(compiled(*args))
        report[name] = {
            "collectives": measure.collectives(compiled),
            "state_bytes": sharding.device_bytes(args[:2]),
            "argument_bytes": compiled.memory_analysis().argument_size_in_bytes,
            "batch_bytes": sharding.device_bytes(args[2]),
            "param_ratio": equivalence.worst_ratio(new[0], one[0], step_bound),
            "loss_diff": float(abs(new[2]["loss"] - one[2]["loss"])),
            "passes": comms.passes(compiled, param_bytes, 8),
        }
    # jitted: called as it is, shard_map runs its body one operation at a time (a compile each)
    per_device_grad = lambda mean: jax.jit(
        sharding.shard_map_grad(jaxloops.mlp_loss, mesh, mean=mean)
    )
    placed = sharding.place(mesh, jaxloops.strategy_specs(params, "dp", mesh), params)
    rows = sharding.place(mesh, ROWS, batch)
    grads = {
        "dp": grad_fn(placed, rows),
        "shard_map": per_device_grad(True)(placed, rows),
        "negated": jax.tree.map(lambda g: -g, g_one),  # known-wrong: sign flipped
        "zeroed": jax.tree.map(np.zeros_like, g_one),  # known-wrong: zero
    }
    unscaled = per_device_grad(False)
    grads["no_pmean"] = jax.tree.map(lambda g: g / 8, jax.device_get(unscaled(placed, rows)))
    report["grad"] = {k: equivalence.worst_ratio(g, g_one, g_bound) for k, g in grads.items()}
    report["grad_ratio"] = report["grad"]["dp"]
    no_pmean = unscaled.lower(placed, rows).compile()
    report["no_pmean_collectives"] = measure.collectives(no_pmean)
    report["param_bytes"] = param_bytes


def stacked(report, mesh, split) -> None:
    """The stacked MLP: FSDP per layer (both forms) and tensor parallel, against one device."""
    L, B = SIZES.stack_layers, SIZES.stack_batch
    init = jax.jit(
        fsdp.init_stack, static_argnames=("features", "width", "hidden", "layers", "classes")
    )  # one program, not one per op
    params = jax.device_get(init(
        jax.random.key(5), features=64, width=SIZES.stack_width, hidden=SIZES.stack_hidden,
        layers=L, classes=10))  # fmt: skip
    batch = jaxloops.Batch(split.train.x[:B], split.train.y[:B])
    bound = equivalence.gradient_bound(fsdp.stack_loss, params, batch)
    grad = lambda loss: jax.jit(jax.grad(lambda p, b: loss(p, b)[0]))
    one = grad(fsdp.stack_loss)(params, batch)
    specs = fsdp.stack_specs()
    on_mesh = sharding.place(mesh, specs, params), sharding.place(mesh, ROWS, batch)
    grid = tensor_parallel.grid_mesh(SIZES.grid, jax.devices("cpu"))
    held = {}
    forms = {
        "per_layer": (grad(fsdp.per_layer_loss(mesh)), on_mesh),
        "twin": (jax.jit(fsdp.shard_map_fsdp_grad(mesh, specs)), on_mesh),
    }
    for name, with_fsdp in (("tp", False), ("tp_fsdp", True)):
        tp_specs = tensor_parallel.tp_specs(params, grid, fsdp=with_fsdp)
        args = sharding.place(grid, tp_specs, params), sharding.place(grid, ROWS, batch)
        forms[name] = (grad(tensor_parallel.tp_loss(grid)), args)
        w1 = args[0]["layers"]["w1"]  # (L, D, F): one layer's (D, F) blocks on the grid
        layer = jax.sharding.NamedSharding(grid, jax.P(*w1.sharding.spec[1:]))
        held[name] = tensor_parallel.held_blocks(layer, w1.shape[1:])
    activation = B // SIZES.grid[0] * SIZES.stack_width * 4
    report["stack"] = {
        "L": L,
        "P": int(sum(a.nbytes for a in jax.tree.leaves(params))),
        "P_L": int(sum(a.nbytes for a in jax.tree.leaves(params["layers"]))),
        "activation": activation,
    }
    report["held"] = {name: sorted(map(list, blocks.items())) for name, blocks in held.items()}
    for name, (fn, args) in forms.items():
        program = fn.lower(*args).compile()
        report["stack"][name] = {
            "ratio": equivalence.worst_ratio(program(*args), one, bound),
            "steps": comms.per_step(program, trips=L),
            "activations": comms.per_step(program, trips=L, only_bytes=activation),
            "state_bytes": sharding.device_bytes(args[0]),
            "passes": comms.passes(program, report["stack"]["P"], 8, trips=L),
        }


def bad_inputs(mesh, params, opt_state, batch, optimizer) -> dict:
    """The ValueError message of each bad input (None where none was raised)."""

    def error_of(fn):
        try:
            fn()
        except ValueError as e:
            return str(e)
        return None

    odd = jaxloops.Batch(batch.x[:12], batch.y[:12])
    step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    specs = [jaxloops.strategy_specs(t, "dp", mesh) for t in (params, opt_state)]
    shard_map = jaxloops.shard_map_step(jaxloops.mlp_loss, optimizer, mesh)
    return {
        "mesh": error_of(lambda: jaxloops.data_mesh(9, jax.devices("cpu"))),
        "batch": error_of(
            lambda: jax.jit(jaxloops.sharded_step(step, mesh, *specs))(params, opt_state, odd)
        ),
        "shard_map_batch": error_of(lambda: shard_map(params, opt_state, odd)),
        "spec": error_of(lambda: sharding.place(mesh, jax.P("data"), np.zeros((10, 3)))),
    }


def processes(report, mesh, split, out_dir):
    """Data parallel with `fit` in this process and on two processes of four devices."""
    n = SIZES.examples
    train = jaxloops.Batch(split.train.x[:n], split.train.y[:n])
    trained, opt_state, _ = jaxloops.fit_data_parallel(jax.random.key(0), mesh, train, n, SIZES)
    one_process = jaxloops.checkpoint.flat_arrays(trained)
    report["processes_skipped"] = sharding.no_tcp_reason()
    if report["processes_skipped"]:  # the two tests of the processes skip, with this reason
        return
    saved = f"{out_dir}/checkpoint"
    two = sharding.run_processes(
        out_dir, num_processes=2, devices_per_process=4, sizes=SIZES, save=saved
    )
    report["process_diff"] = max(float(np.max(np.abs(one_process[k] - two[k]))) for k in two
                                 if k in one_process)  # fmt: skip
    # The checkpoint both processes saved, restored here into either strategy.
    state = {k: a for k, a in two.items() if k != "loss"}
    shapes = jax.eval_shape(lambda: (trained, opt_state))
    report["restored"] = {}
    for kind in ("dp", "fsdp"):
        specs = jaxloops.strategy_specs(shapes, kind, mesh)
        at = lambda a, s: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=jax.NamedSharding(mesh, s)
        )
        manager = jaxloops.checkpoint_manager(saved, keep_last=1)
        back = jaxloops.restore_latest(manager, jax.random.key(0), *jax.tree.map(at, shapes, specs))
        flat = jaxloops.checkpoint.flat_arrays({"opt_state": back.opt_state})
        flat |= jaxloops.checkpoint.flat_arrays(back.params)
        report["restored"][kind] = {
            "differing": equivalence.differing(flat, state), "arrays": len(flat),
            "state_bytes": sharding.device_bytes((back.params, back.opt_state)),
        }  # fmt: skip


def main(out_dir: str) -> None:
    workers.check_cpu_devices(8)
    mesh = jaxloops.data_mesh(8, jax.devices("cpu"))
    split = jaxloops.load_digits_split(seed=0)
    batch = jaxloops.Batch(split.train.x[:40], split.train.y[:40])
    shifted = jaxloops.Batch(split.train.x[1:41], split.train.y[1:41])
    params = jax.device_get(jaxloops.init_mlp(jax.random.key(3), (64, *SIZES.hidden, 10)))
    optimizer = jaxloops.make_optimizer(SIZES.learning_rate, SIZES.weight_decay)
    opt_state = jax.device_get(jax.jit(optimizer.init)(params))
    report = {}
    strategies(report, mesh, params, opt_state, batch, shifted, optimizer)
    stacked(report, mesh, split)
    report["errors"] = bad_inputs(mesh, params, opt_state, batch, optimizer)
    processes(report, mesh, split, out_dir)
    print("REPORT" + json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
