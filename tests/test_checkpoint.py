import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from orbax.checkpoint import checkpoint_managers

import jaxloops
from conftest import once_per_session
from jaxloops import checkpoint, equivalence, sharding, workers
from jaxloops.workers import checkpoint as checkpoint_worker

EPOCHS, STOP, KILL = 3, 1, 2
CPU = jax.devices("cpu")[0]  # where the runs live, here and in the CPU-pinned workers
# Sized for a test (the chapter's runs are larger): the MLP of part `loop` with narrow hidden
# layers, a transformer of part `lm`'s kind with odd, distinct widths, on few windows.
_CPU_SIZES = jaxloops.experiment_sizes("cpu")
SIZES = dataclasses.replace(
    _CPU_SIZES,
    loop=dataclasses.replace(_CPU_SIZES.loop, hidden=(24, 16), batch_size=128),
    lm=dataclasses.replace(
        _CPU_SIZES.lm,
        num_layers=1,
        model_dim=20,
        num_heads=4,
        num_kv_heads=2,
        hidden_dim=36,
        max_len=16,
        batch_size=8,
    ),  # fmt: skip
    checkpoint=dataclasses.replace(_CPU_SIZES.checkpoint, lm_text_bytes=2**14, lm_windows=24),
)
SIZES_ARG = (
    "--sizes",
    workers.sizes_json(loop=SIZES.loop, lm=SIZES.lm, checkpoint=SIZES.checkpoint),
)


# AdamW's init as one program: eagerly, it compiles one per leaf shape.
ADAMW_INIT = jax.jit(optax.adamw(1e-3).init)


def small_state(shift: float = 0.0):
    """Odd, distinct sizes so that a transposed axis cannot pass by accident."""
    shift = np.float32(shift)
    w, b = np.arange(35, dtype=np.float32).reshape(5, 7) + shift, np.full(7, shift)
    params = jax.device_put({"dense": {"w": w, "b": b}})  # made on the host: no program
    return params, ADAMW_INIT(params), jax.random.key(11)


def save_steps(directory, steps, **manager_options):
    manager = checkpoint.checkpoint_manager(directory, **manager_options)
    for step in steps:
        params, opt_state, key = small_state(step)
        checkpoint.checkpoint_hook(manager, key)(step, params, opt_state)
    manager.wait_until_finished()
    return manager


def data_file(directory, step):
    """The largest array file of checkpoint `step` (state/d holds the merged OCDBT data)."""
    return max((directory / str(step) / "state" / "d").iterdir(), key=lambda p: p.stat().st_size)


def test_restore_returns_every_leaf_and_the_typed_key(tmp_path):
    params, opt_state, key = small_state(3.0)
    manager = save_steps(tmp_path, [3], keep_last=2)
    like = jax.eval_shape(lambda: (params, opt_state))
    restored = checkpoint.restore_latest(manager, key, *like)
    assert restored.epoch == 3
    assert restored.key.dtype == key.dtype
    np.testing.assert_array_equal(jax.random.key_data(restored.key), jax.random.key_data(key))
    for got, want in zip(jax.tree.leaves(restored[2:]), jax.tree.leaves((params, opt_state))):
        np.testing.assert_array_equal(got, want)
    assert jax.tree.structure(restored.opt_state) == jax.tree.structure(opt_state)


def test_save_has_read_the_arrays_when_it_returns(tmp_path):
    """fit donates params after the hook returns: deleting them then must not lose the save."""
    params, opt_state, key = small_state(5.0)
    expected = np.asarray(params["dense"]["w"])
    manager = checkpoint.checkpoint_manager(tmp_path, keep_last=1)
    checkpoint.checkpoint_hook(manager, key)(1, params, opt_state)
    for leaf in jax.tree.leaves((params, opt_state)):
        leaf.delete()
    manager.wait_until_finished()
    like = jax.eval_shape(lambda: small_state()[:2])
    restored = checkpoint.restore_latest(manager, key, *like)
    np.testing.assert_array_equal(restored.params["dense"]["w"], expected)


def test_no_checkpoint_restores_none(tmp_path):
    params, opt_state, key = small_state()
    manager = checkpoint.checkpoint_manager(tmp_path, keep_last=1)
    assert checkpoint.restore_latest(manager, key, params, opt_state) is None


# A read that fails ends orbax's asyncio loop while TensorStore's other reads of the same
# step are still in flight; their callbacks then find the loop closed ("Event loop is
# closed", raised in a TensorStore thread and ignored). Only a broken checkpoint does this.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_broken_checkpoints_are_reported_and_skipped(tmp_path):
    save_steps(tmp_path, [1, 2, 3, 4], keep_last=4).close()
    truncated = data_file(tmp_path, 4)
    truncated.write_bytes(truncated.read_bytes()[:8])  # cut short: 8 bytes left
    data_file(tmp_path, 3).unlink()
    (tmp_path / "2" / "state" / "_METADATA").unlink()
    params, opt_state, key = small_state()
    manager = checkpoint.checkpoint_manager(tmp_path, keep_last=4)
    with pytest.warns(checkpoint.BrokenCheckpointWarning) as caught:
        restored = checkpoint.restore_latest(manager, key, params, opt_state)
    manager.close()
    messages = [str(w.message) for w in caught if w.category is checkpoint.BrokenCheckpointWarning]
    assert [m.split(" is broken")[0] for m in messages] == [
        f"checkpoint step {s}" for s in (4, 3, 2)
    ]
    for step, message in zip((4, 3, 2), messages):
        assert str(tmp_path / str(step)) in message
    assert restored.epoch == 1
    np.testing.assert_array_equal(restored.params["dense"]["b"], np.full(7, 1.0))


def test_partially_written_checkpoint_is_never_listed(tmp_path):
    """orbax writes into a temporary directory, renamed when complete; a kill leaves only that."""
    manager = save_steps(tmp_path, [1, 2], keep_last=3)
    partial = tmp_path / "3.orbax-checkpoint-tmp-1234567"
    (tmp_path / "2").rename(partial)
    data_file(partial.parent, partial.name).unlink()
    params, opt_state, key = small_state()
    manager = checkpoint.checkpoint_manager(tmp_path, keep_last=3)
    assert manager.all_steps() == [1]
    assert checkpoint.restore_latest(manager, key, params, opt_state).epoch == 1


def test_mismatched_structure_names_the_path(tmp_path):
    manager = save_steps(tmp_path, [1], keep_last=1)
    params, opt_state, key = small_state()
    zeros = lambda *shape: jax.device_put(np.zeros(shape, np.float32))  # no program
    wide = {"dense": {"w": zeros(5, 9), "b": zeros(9)}}
    # the optimizer state as shapes alone (restore_latest takes either): nothing compiled
    with pytest.raises(
        ValueError, match=r"step 1: opt_state\.0\.mu\.dense\.b .*float32\[7\].*\[9\]"
    ):
        checkpoint.restore_latest(manager, key, wide, jax.eval_shape(ADAMW_INIT, wide))
    extra = {**params, "head": {"w": zeros(7, 3)}}
    with pytest.raises(ValueError, match=r"has no params\.head\.w"):
        checkpoint.restore_latest(manager, key, extra, opt_state)
    with pytest.raises(ValueError, match=r"keep_last must be >= 1, got 0"):
        checkpoint.checkpoint_manager(tmp_path, keep_last=0)
    # Another rank: the weight flattened to one axis.
    flat = {"dense": {"w": zeros(35), "b": params["dense"]["b"]}}
    with pytest.raises(
        ValueError, match=r"dense\.w is saved as float32\[5, 7\], the target has float32\[35\]"
    ):
        checkpoint.restore_latest(manager, key, flat, jax.eval_shape(ADAMW_INIT, flat))


def test_a_target_sharded_over_more_axes_than_its_rank_is_refused_by_name():
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices("cpu")[:1])
    with pytest.raises(ValueError, match="rank at least 2, but was applied to a value of rank 1"):
        jax.ShapeDtypeStruct((7,), "float32", sharding=jax.NamedSharding(mesh, jax.P("data", None)))


def test_retention_keeps_the_last_and_the_best(tmp_path):
    losses = {1: 0.9, 2: 0.3, 3: 0.5, 4: 0.7, 5: 0.8, 6: 0.6}
    manager = checkpoint.checkpoint_manager(tmp_path, keep_last=2, best_metric="val_loss")
    for step, loss in losses.items():
        params, opt_state, key = small_state(step)
        hook = checkpoint.checkpoint_hook(manager, key, evaluate=lambda p, v=loss: {"val_loss": v})
        assert hook(step, params, opt_state) == {"val_loss": loss}
    manager.wait_until_finished()
    on_disk = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert on_disk == [2, 5, 6]


def test_state_bytes_counts_adam_as_three_times_the_params():
    params, opt_state, key = small_state()
    param_bytes = checkpoint.state_bytes(params)
    assert param_bytes == (35 + 7) * 4
    assert checkpoint.state_bytes((params, opt_state, key)) == 3 * param_bytes + 4 + 8


@pytest.fixture(scope="module")
def worker_cache(tmp_path_factory):
    """The worker processes share a persistent compilation cache (unless one is configured):
    a resuming process loads the programs that the process before it compiled."""
    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            patch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax-cache")))
            patch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        yield


def train_in_new_process(*args) -> subprocess.CompletedProcess:
    """Runs `checkpoint_worker train *args` in a new Python process, which must succeed."""
    finished = subprocess.run(
        workers.command("checkpoint", "train", *args, *SIZES_ARG),
        capture_output=True, text=True, env=workers.cpu_env(1),
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-2000:]
    return finished


def uninterrupted_npz(root, name, params, opt_state) -> str:
    flat = checkpoint.flat_arrays({"params": params, "opt_state": opt_state})
    np.savez(root / f"{name}.npz", **flat)
    return str(root / f"{name}.npz")


def uninterrupted(run, epochs=EPOCHS):
    """`run` trained for `epochs` epochs in this process, never stopped."""
    params, opt_state, _ = jaxloops.fit(
        run.key, *run.init(), run.train_step, run.data, batch_size=run.batch_size,
        epochs=epochs, epochs_per_call=1,
    )  # fmt: skip
    return params, opt_state


@pytest.fixture(scope="module")
def resumed_runs(worker_cache, tmp_path_factory, worker_id):
    """Four interrupted runs, all resumed in one new process (once per session); and the
    uninterrupted MLP and transformer runs, trained here meanwhile. See `run_all`."""
    shared = once_per_session(tmp_path_factory, worker_id, "checkpoint-runs", run_all)
    arrays = {key: dict(np.load(shared[key])) for key in ("final", "mlp", "transformer")}
    return {**shared, **arrays}


@pytest.fixture(scope="module")
def mlp_runs(resumed_runs):
    """Runs 0-2: an MLP stopped after STOP epochs here, one killed with SIGKILL after saving
    epoch KILL in another process, one sent SIGTERM in a third; the uninterrupted MLP."""
    return {**resumed_runs, "uninterrupted": resumed_runs["mlp"]}


@pytest.fixture(scope="module")
def transformer_runs(resumed_runs):
    """Run 3: a transformer stopped after STOP epochs in one process and resumed in a new one
    (what both printed); the uninterrupted transformer."""
    lines = (resumed_runs["transformer_stopped"] + resumed_runs["stdout"]).splitlines()
    stdout = "\n".join(line for line in lines if line.startswith("transformer:"))
    return {**resumed_runs, "uninterrupted": resumed_runs["transformer"], "stdout": stdout}


def run_all(root) -> dict:
    mlp, transformer = (checkpoint_worker.experiment(m, SIZES, CPU) for m in ("mlp", "transformer"))
    killed_command = workers.command(
        "checkpoint", "train", f"mlp:{root / 'killed'}", "--epochs", EPOCHS, "--lost-at", KILL,
        *SIZES_ARG,
    )  # fmt: skip
    warned = workers.command(
        "checkpoint", "train", f"mlp:{root / 'warned'}", "--epochs", EPOCHS, "--every", 100,
        "--slow", 1.0, *SIZES_ARG,
    )  # fmt: skip
    stopped = f"transformer:{root / 'stopped-transformer'}"
    # The uninterrupted runs first: their programs are then in the persistent compilation
    # cache, and the processes below load them instead of each compiling its own.
    mlp_npz = uninterrupted_npz(root, "mlp", *uninterrupted(mlp))
    transformer_npz = uninterrupted_npz(root, "transformer", *uninterrupted(transformer))
    with concurrent.futures.ThreadPoolExecutor() as pool:  # the other processes run meanwhile
        killing = pool.submit(
            subprocess.run, killed_command, capture_output=True, text=True,
            env=workers.cpu_env(1),
        )  # fmt: skip
        # ... one sent SIGTERM after its first epoch, which it trained without saving ...
        terminating = pool.submit(
            checkpoint_worker.kill_after, warned, "mlp: trained epoch 1", workers.cpu_env(1),
            signal.SIGTERM,
        )  # fmt: skip
        # ... and a transformer stopped after STOP epochs in a process of its own.
        stopping = pool.submit(train_in_new_process, stopped, "--epochs", EPOCHS, "--stop-at", STOP)
        manager = checkpoint.checkpoint_manager(root / "stopped", keep_last=2)
        jaxloops.fit(
            mlp.key, *mlp.init(), mlp.train_step, mlp.data, batch_size=mlp.batch_size,
            epochs=STOP, epochs_per_call=1, hook=checkpoint.checkpoint_hook(manager, mlp.key),
        )  # fmt: skip
        manager.wait_until_finished()
        killed = killing.result()
        term_status, term_printed = terminating.result()
        transformer_stopped = stopping.result().stdout
    status, printed = killed.returncode, killed.stdout.splitlines()
    unfinished = checkpoint.temporary_dirs(root / "killed")
    warned_steps = checkpoint.checkpoint_manager(root / "warned", keep_last=2).all_steps()
    finished = train_in_new_process(
        f"mlp:{root / 'stopped'}", f"mlp:{root / 'killed'}", f"mlp:{root / 'warned'}", stopped,
        "--epochs", EPOCHS, "--out", root / "final.npz",
    )  # fmt: skip
    return dict(
        unfinished=unfinished, left=checkpoint.temporary_dirs(root / "killed"),
        status=status, printed=printed, stdout=finished.stdout, final=str(root / "final.npz"),
        term_status=term_status, term_printed=term_printed, warned_steps=warned_steps,
        transformer_stopped=transformer_stopped, mlp=mlp_npz, transformer=transformer_npz,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("runs", "index"),
    [("mlp_runs", 0), ("mlp_runs", 1), ("mlp_runs", 2), ("transformer_runs", 3)],
)
def test_resumed_run_equals_the_uninterrupted_run_bit_for_bit(request, runs, index):
    """Run `index` of the resuming process (0: the stopped MLP, 1: the killed one, 2: the
    warned one, 3: the stopped transformer)."""
    runs = request.getfixturevalue(runs)
    reference, final = runs["uninterrupted"], runs["final"]
    assert len(reference) > 5
    prefix = f"{index}."
    mine = {name[len(prefix) :]: value for name, value in final.items() if name.startswith(prefix)}
    assert equivalence.differing(mine, reference) == []


def test_the_stopped_transformer_started_fresh_and_resumed_where_it_stopped(transformer_runs):
    starts = [line for line in transformer_runs["stdout"].splitlines() if "starting at" in line]
    assert starts == ["transformer: starting at epoch 0", f"transformer: starting at epoch {STOP}"]


def test_the_killed_run_was_killed_and_resumed_from_its_checkpoint(mlp_runs):
    """--lost-at KILL: the process SIGKILLed itself as epoch KILL's save began, so that save
    was cut off (its temporary directory left behind, then deleted by the resumed run) and
    the run resumed from epoch KILL - 1."""
    assert mlp_runs["status"] == -9
    assert mlp_runs["printed"][-1] == f"mlp: saving epoch {KILL}; the machine is lost"
    assert mlp_runs["unfinished"] == [f"{KILL}{checkpoint.TMP_SUFFIX}"]
    assert mlp_runs["left"] == []
    starts = [line for line in mlp_runs["stdout"].splitlines() if "starting at" in line]
    assert starts[0] == f"mlp: starting at epoch {STOP}"  # the stopped run, where it stopped
    assert starts[1] == f"mlp: starting at epoch {KILL - 1}"


def test_sigterm_saves_the_epoch_it_is_in_and_exits_cleanly(mlp_runs):
    """Saving only every 100 epochs (never, in its EPOCHS), the warned run saved the epoch
    SIGTERM found it in and left with status 0."""
    assert mlp_runs["term_status"] == 0, mlp_runs["term_printed"]
    last = mlp_runs["term_printed"][-1]
    assert last.startswith("mlp: SIGTERM, saved epoch "), mlp_runs["term_printed"]
    epoch = int(last.rsplit(" ", 1)[1])
    assert 1 <= epoch <= EPOCHS and mlp_runs["warned_steps"] == [epoch]


def test_checkpoint_from_8_devices_restores_onto_4(tmp_path):
    """The restoring process starts with the saving one and waits for a complete step."""

    def start(*args, devices):
        command = workers.command("checkpoint", *args, "--devices", devices, *SIZES_ARG)
        env = workers.cpu_env(devices)  # CPU devices, whatever the default backend here
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)

    saving = start("mesh-save", tmp_path / "ckpt", devices=8)
    restoring = start(
        "mesh-restore", tmp_path / "ckpt", "--wait", 120, "--out", tmp_path / "4.npz", devices=4
    )
    saved, restored = (json.loads(process.communicate()[0]) for process in (saving, restoring))
    assert saving.returncode == 0 and restoring.returncode == 0
    assert saved["devices"] == 8 and restored["devices"] == 4
    assert max(saved["shards"].values()) == 8 and max(restored["shards"].values()) == 4
    # Split where the devices divide an axis; the 10-value output bias is copied on each.
    for report in (saved, restored):
        assert report["split"]["params.dense_0.w"] and not report["split"]["params.dense_2.b"]
    four = dict(np.load(tmp_path / "4.npz"))
    params, opt_state = checkpoint_worker.stepped_mlp_state(SIZES, CPU)
    reference = checkpoint.flat_arrays({"params": params, "opt_state": opt_state})
    assert any(name.startswith("opt_state.") for name in four)  # the optimizer state too
    assert equivalence.differing(four, reference) == []
    # A restore that re-initialised the optimizer (or the parameters) would not pass.
    params0, opt_state0 = checkpoint_worker.experiment("mlp", SIZES, CPU).init()
    initial = checkpoint.flat_arrays({"params": params0, "opt_state": opt_state0})
    assert len(equivalence.differing(four, initial)) == len(initial)
    # The checkpoint records the sharding it was saved with: the mesh, the spec, the chunk.
    stored = checkpoint.stored_shardings(tmp_path / "ckpt", 0)["params.dense_0.w"]
    assert stored["sharding_type"] == "NamedSharding" and stored["axis_names"] == ["data"]
    assert stored["partition_spec"] == ["data"]
    assert [d["id"] for d in stored["device_mesh"]["mesh"]] == list(range(8))
    assert stored["chunk_shape"] == [64 // 8, SIZES.loop.hidden[0]]


def test_the_unfinished_save_of_a_killed_run_is_deleted_on_creation(tmp_path):
    # orbax 0.12.8: the manager's creation starts the deletion, before any save; a manager
    # made without cleanup_tmp_directories (the control, made first) keeps its directory.
    unfinished = {}
    for name in ("control", "ours"):
        unfinished[name] = tmp_path / name / f"3{checkpoint.TMP_SUFFIX}"
        unfinished[name].mkdir(parents=True)
        (unfinished[name] / "half-written").write_bytes(b"cut off")
    ocp.CheckpointManager(tmp_path / "control", options=ocp.CheckpointManagerOptions())
    manager = checkpoint.checkpoint_manager(tmp_path / "ours", keep_last=2)
    assert checkpoint.wait_for_no_temporary_dirs(tmp_path / "ours", 30) == []
    assert manager.all_steps() == []
    assert checkpoint.temporary_dirs(tmp_path / "control") == [unfinished["control"].name]
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        checkpoint.wait_for_no_temporary_dirs(tmp_path / "ours", -1)


def test_the_manager_saves_at_a_preemption_whatever_the_interval(tmp_path):
    # The policy passed to orbax replaces its default, which saves at a preemption sync
    # point: ours must keep that. A manager given the interval alone is the wrong answer.
    def saves_at(manager):
        manager.reached_preemption = lambda step: step == 3  # as JAX reports a sync point
        return [step for step in range(1, 11) if manager.should_save(step)]

    ours = checkpoint.checkpoint_manager(tmp_path / "ours", keep_last=1, every=5)
    assert saves_at(ours) == [3, 5, 10]
    interval_only = ocp.CheckpointManager(
        tmp_path / "interval-only",
        options=ocp.CheckpointManagerOptions(
            save_decision_policy=checkpoint_managers.FixedIntervalPolicy(5)
        ),
    )
    assert saves_at(interval_only) == [5, 10]  # no preemption save: what the check catches


def test_the_hook_stops_fit_once_the_preemption_save_is_made(tmp_path):
    manager = checkpoint.checkpoint_manager(tmp_path, keep_last=2, every=100)
    manager.reached_preemption = lambda step: step == 2
    run = checkpoint_worker.experiment("mlp", SIZES, CPU)
    _, _, history = jaxloops.fit(
        run.key, *run.init(), run.train_step, run.data, batch_size=run.batch_size, epochs=5,
        epochs_per_call=1, hook=checkpoint.checkpoint_hook(manager, run.key),
    )  # fmt: skip
    assert history.hooks == [(2, {"stop": True})] and manager.all_steps() == [2]


@pytest.mark.skipif(sharding.no_tcp_reason() is not None, reason="jax.distributed needs TCP")
def test_two_processes_save_the_same_epoch_when_one_is_sent_sigterm(tmp_path):
    statuses, printed = checkpoint_worker.preempt_together(
        tmp_path / "together", epochs=60, every=60, slow=(0.05, 0.3), signal_after=2,
        sizes_arg=SIZES_ARG[1],
    )  # fmt: skip
    saved = [int(lines[-1].rsplit(" ", 1)[1]) for lines in printed]
    assert statuses == [0, 0] and saved[0] == saved[1] and saved[0] > 2, printed
    assert all("preempted, saved epoch" in lines[-1] for lines in printed), printed
    manager = checkpoint.checkpoint_manager(tmp_path / "together", keep_last=1)
    assert manager.all_steps() == [saved[0]]


def test_preempt_together_refuses_bad_arguments_before_starting(tmp_path):
    (tmp_path / "a-file").write_text("")
    bad = [
        (dict(slow=(0.1,)), "need >= 2 processes"),
        (dict(slow=(0.1, -1.0)), "paces >= 0"),
        (dict(signal_after=60), "signal_after must be in"),
        (dict(directory=tmp_path / "a-file"), "a-file is a file"),
        (dict(directory=tmp_path / "no" / "such"), "parent .* does not exist"),
    ]
    for change, message in bad:
        kwargs = dict(directory=tmp_path / "d", epochs=60, every=60, slow=(0.1, 0.2),
                      signal_after=2, sizes_arg=SIZES_ARG[1]) | change  # fmt: skip
        with pytest.raises(ValueError, match=message):
            checkpoint_worker.preempt_together(kwargs.pop("directory"), **kwargs)
    assert not (tmp_path / "d").exists()


def test_path_arguments_are_checked_before_any_work(tmp_path):
    (tmp_path / "a-file").write_text("")
    for bad, message in [
        (tmp_path / "a-file", "a-file is a file"),
        (tmp_path / "no" / "such", "parent .*no does not exist"),
    ]:
        with pytest.raises(ValueError, match=message):
            checkpoint.checkpoint_manager(bad, keep_last=1)
        with pytest.raises(ValueError, match=message):
            checkpoint_worker.wait_for_checkpoint(bad, 0)
    for read in (checkpoint.temporary_dirs, lambda d: checkpoint.stored_shardings(d, 0)):
        with pytest.raises(ValueError, match="missing does not exist"):
            read(tmp_path / "missing")
        with pytest.raises(ValueError, match="a-file is a file"):
            read(tmp_path / "a-file")
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        checkpoint_worker.wait_for_checkpoint(tmp_path, -1)
    manager = save_steps(tmp_path / "saved", [2], keep_last=1)
    assert checkpoint.checkpoint_bytes(manager, 2) > 0
    with pytest.raises(ValueError, match="step 5 is not on disk: no directory .*saved/5"):
        checkpoint.checkpoint_bytes(manager, 5)
    with pytest.raises(ValueError, match="step 5 is not on disk: no directory .*saved/5/state"):
        checkpoint.stored_shardings(tmp_path / "saved", 5)
    run = None  # the worker's train refuses before it builds or installs anything
    with pytest.raises(ValueError, match="parent .*no does not exist"):
        checkpoint_worker.train("mlp", run, tmp_path / "no" / "such", 3, 1, 0.0)
    with pytest.raises(ValueError, match="need slow >= 0 s and stop_at >= 1, got -1"):
        checkpoint_worker.train("mlp", run, tmp_path / "ok", 3, 1, -1.0)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert not (tmp_path / "no").exists() and not (tmp_path / "ok").exists()


def test_the_save_interval_writes_only_its_multiples(tmp_path):
    manager = save_steps(tmp_path, range(1, 8), keep_last=10, every=3)
    assert manager.all_steps() == [3, 6]
    with pytest.raises(ValueError, match="every must be >= 1, got 0"):
        checkpoint.checkpoint_manager(tmp_path / "never", keep_last=1, every=0)


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match="'resnet'"):
        checkpoint_worker.experiment("resnet", SIZES, CPU)


@pytest.fixture(scope="module")
def resumed_here(tmp_path_factory):
    """The MLP stopped after STOP epochs and resumed in this process, right and wrong."""
    root = tmp_path_factory.mktemp("here")
    run = checkpoint_worker.experiment("mlp", SIZES, CPU)
    train = lambda key, state, **kw: jaxloops.fit(
        key, *state, run.train_step, run.data, batch_size=run.batch_size, epochs_per_call=1, **kw
    )
    reference = train(run.key, run.init(), epochs=EPOCHS)[:2]
    manager = checkpoint.checkpoint_manager(root, keep_last=2)
    train(run.key, run.init(), epochs=STOP, hook=checkpoint.checkpoint_hook(manager, run.key))
    manager.wait_until_finished()
    # shapes alone: restored where run.key lives (the CPU), on a GPU machine too
    back = checkpoint.restore_latest(manager, run.key, *jax.eval_shape(run.init))
    fresh_opt_state = run.init()[1]
    # fit donates what it is given: copies through the host, placed as the originals are
    # (jnp.copy would compile one program per leaf shape)
    copy = lambda tree: jax.tree.map(lambda a: jax.device_put(np.asarray(a), a.sharding), tree)
    resumed = {
        "right": train(back.key, copy((back.params, back.opt_state)), epochs=EPOCHS,
                       start_epoch=back.epoch),
        # epoch e trained on epoch e + 1's order: the data order off by one
        "order": train(back.key, copy((back.params, back.opt_state)), epochs=EPOCHS + 1,
                       start_epoch=back.epoch + 1),
        # the optimizer state not restored: Adam's moments and count of a fresh run
        "stale": train(back.key, (copy(back.params), fresh_opt_state), epochs=EPOCHS,
                       start_epoch=back.epoch),
    }  # fmt: skip
    as_flat = lambda state: checkpoint.flat_arrays(dict(zip(("params", "opt_state"), state[:2])))
    return as_flat(reference), {name: as_flat(state) for name, state in resumed.items()}


def test_a_resume_in_this_process_is_identical(resumed_here):
    reference, resumed = resumed_here
    assert equivalence.differing(resumed["right"], reference) == []


@pytest.mark.parametrize("mutant", ["order", "stale"])
def test_the_identity_check_rejects_a_wrong_resume(resumed_here, mutant):
    """An off-by-one data order, or a stale optimizer state, changes every parameter."""
    reference, resumed = resumed_here
    wrong = equivalence.differing(resumed[mutant], reference)
    assert {"params.dense_0.w", "opt_state.0.mu.dense_0.w"} <= set(wrong), wrong


def test_differing_names_missing_and_retyped_arrays():
    a = {"w": np.zeros(3, np.float32), "b": np.ones(2, np.float32)}
    assert equivalence.differing(a, dict(a)) == []
    assert equivalence.differing(a, {"w": a["w"]}) == ["b"]
    assert equivalence.differing(a, {**a, "w": a["w"].astype(np.float64)}) == ["w"]
    assert equivalence.differing(a, {**a, "w": np.nextafter(a["w"], 1)}) == ["w"]
