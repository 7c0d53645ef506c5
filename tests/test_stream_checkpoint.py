"""The model and the Grain iterator in one checkpoint; a run killed mid-epoch resumes bit
for bit (chapter 15).

Where grain is not installed, `pytest.importorskip` skips this module (the device run carries
its wheel: scripts/device_run.py, setup).
"""

import concurrent.futures
import dataclasses

import numpy as np
import pytest

grain = pytest.importorskip("grain")

import jax  # noqa: E402

import jaxloops  # noqa: E402
from jaxloops import checkpoint, equivalence, stream_checkpoint, streaming, workers  # noqa: E402
from jaxloops.text import VOCAB_SIZE  # noqa: E402
from jaxloops.workers import checkpoint as checkpoint_worker  # noqa: E402
from jaxloops.workers import streaming as streaming_worker  # noqa: E402

# 40 records of 5 + 1 tokens, batches of 3: 13 batches per epoch, 26 in two. The kill
# comes after the save of step 20, in the second epoch; saves every 5 steps.
SIZES = dataclasses.replace(
    jaxloops.experiment_sizes("cpu").streaming,
    context=5, records_per_shard=9, hidden=(11,), batch_size=3, epochs=2, save_every=5,
    kill_step=20,
)  # fmt: skip
CPU = jax.devices("cpu")[0]


@pytest.fixture
def shards(tmp_path):
    tokens = (np.arange(40 * 6) * 7 + 3) % VOCAB_SIZE
    streaming.write_shards(tmp_path / "shards", tokens, SIZES.context, SIZES.records_per_shard)
    return tmp_path / "shards"


def test_a_restored_iterator_continues_where_the_saved_one_was(shards, tmp_path):
    run = streaming.stream_run(shards, SIZES)
    params, opt_state = run.init()
    iterator = streaming.prefetched(run.dataset, CPU)
    for _ in range(4):
        next(iterator)
    manager = stream_checkpoint.stream_manager(tmp_path / "ckpt", keep_last=2)
    stream_checkpoint.save_stream(manager, 4, params, opt_state, iterator, run.fingerprint)
    manager.wait_until_finished()
    following = [next(iterator).y for _ in range(3)]
    fresh = streaming.prefetched(run.dataset, CPU)
    resumed = stream_checkpoint.restore_stream(
        manager, params, opt_state, fresh, run.fingerprint, len(run.dataset)
    )
    assert resumed.step == 4 and resumed.iterator.get_state() == {"next_index": 4}
    for want in following:
        np.testing.assert_array_equal(next(resumed.iterator).y, want)
    assert not equivalence.differing(
        checkpoint.flat_arrays(resumed.params), checkpoint.flat_arrays(params)
    )


def test_no_checkpoint_restores_nothing_and_another_stream_is_refused(shards, tmp_path):
    run = streaming.stream_run(shards, SIZES)
    params, opt_state = run.init()
    iterator = streaming.prefetched(run.dataset, CPU)
    manager = stream_checkpoint.stream_manager(tmp_path / "ckpt", keep_last=1)
    assert stream_checkpoint.restore_stream(manager, params, opt_state, iterator, {}, 1) is None
    stream_checkpoint.save_stream(manager, 0, params, opt_state, iterator, run.fingerprint)
    manager.wait_until_finished()
    other = streaming.stream_run(shards, dataclasses.replace(SIZES, epochs=3))
    with pytest.raises(ValueError, match="epochs 2 saved, 3 here"):
        stream_checkpoint.restore_stream(
            manager, params, opt_state, iterator, other.fingerprint, len(other.dataset)
        )
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        stream_checkpoint.stream_manager(tmp_path / "x", keep_last=0)


def test_a_run_killed_mid_epoch_resumes_bit_for_bit(shards, tmp_path):
    """SIGKILL after the save of step 20 (batch 7 of 13 in epoch 2) in another process; the
    resumed run (here, from the killed one's checkpoints) ends equal to one that never
    stopped (here, meanwhile)."""
    args = ("--shards", shards, "--sizes", workers.sizes_json(streaming=SIZES))
    quiet = lambda _: None
    with concurrent.futures.ThreadPoolExecutor() as pool:
        killing = pool.submit(
            checkpoint_worker.kill_after,
            workers.command("streaming", tmp_path / "killed", *args, "--slow", 0.3),
            f"saved step {SIZES.kill_step}",
            workers.cpu_env(1),
        )
        _, full = streaming_worker.train(tmp_path / "full", shards, SIZES, log=quiet)
        status, printed = killing.result()
    assert status == -9 and printed[-1] == "saved step 20"
    start, state = streaming_worker.train(tmp_path / "killed", shards, SIZES, log=quiet)
    per_epoch = 40 // SIZES.batch_size
    assert 0 < start <= SIZES.kill_step and start % per_epoch  # mid-epoch
    want, got = checkpoint.flat_arrays(full), checkpoint.flat_arrays(state)
    assert want.keys() == got.keys() and not equivalence.differing(got, want)
    assert max(float(np.max(np.abs(got[n] - want[n]))) for n in want) == 0.0


def saved_steps(shards, directory, steps):
    """A manager over `directory` holding a checkpoint after each of `steps` batches."""
    run = streaming.stream_run(shards, SIZES)
    params, opt_state = run.init()
    iterator = streaming.unprefetched(run.dataset)
    manager = stream_checkpoint.stream_manager(directory, keep_last=len(steps))
    taken = 0
    for step in steps:
        for _ in range(step - taken):
            next(iterator)
        taken = step
        stream_checkpoint.save_stream(manager, step, params, opt_state, iterator, run.fingerprint)
        manager.wait_until_finished()
    return run, manager


def state_data_file(directory, step):
    return max((directory / str(step) / "state" / "d").iterdir(), key=lambda p: p.stat().st_size)


def test_a_broken_newest_checkpoint_falls_back_to_the_one_before(shards, tmp_path):
    run, manager = saved_steps(shards, tmp_path / "ckpt", [4, 7])
    state_data_file(tmp_path / "ckpt", 7).unlink()
    fresh = streaming.unprefetched(run.dataset)
    with pytest.warns(checkpoint.BrokenCheckpointWarning, match="step 7 is broken"):
        resumed = stream_checkpoint.restore_stream(
            manager, *run.init(), fresh, run.fingerprint, len(run.dataset)
        )
    assert resumed.step == 4 and resumed.iterator.get_state() == {"next_index": 4}
    np.testing.assert_array_equal(next(resumed.iterator).y, run.dataset[4].y)


def test_when_no_checkpoint_reads_the_iterator_is_left_where_it_was(shards, tmp_path):
    run, manager = saved_steps(shards, tmp_path / "ckpt", [4, 7])
    for step in (4, 7):
        state_data_file(tmp_path / "ckpt", step).unlink()
    fresh = streaming.unprefetched(run.dataset)
    next(fresh)
    with pytest.warns(checkpoint.BrokenCheckpointWarning):
        resumed = stream_checkpoint.restore_stream(
            manager, *run.init(), fresh, run.fingerprint, len(run.dataset)
        )
    assert resumed is None and fresh.get_state() == {"next_index": 1}


def test_an_iterator_state_saved_by_another_process_count_is_refused_by_name(shards, tmp_path):
    run, manager = saved_steps(shards, tmp_path / "ckpt", [4])
    data = tmp_path / "ckpt" / "4" / "data"
    (data / "process_0-of-1.json").rename(data / "process_0-of-2.json")
    fresh = streaming.unprefetched(run.dataset)
    with pytest.raises(checkpoint.Mismatch, match="process_0-of-2.json, this process would "
                       "read process_0-of-1.json"):  # fmt: skip
        stream_checkpoint.restore_stream(
            manager, *run.init(), fresh, run.fingerprint, len(run.dataset)
        )
    assert fresh.get_state() == {"next_index": 0}


def test_path_arguments_are_checked_before_any_work(shards, tmp_path):
    (tmp_path / "a-file").write_text("")
    for bad, message in [
        (tmp_path / "a-file", "a-file is a file"),
        (tmp_path / "no" / "such", "parent .*no does not exist"),
    ]:
        with pytest.raises(ValueError, match=message):
            stream_checkpoint.stream_manager(bad, keep_last=1)
        with pytest.raises(ValueError, match=message):
            streaming_worker.train(bad, shards, SIZES)
    with pytest.raises(ValueError, match="shard directory .*missing does not exist"):
        streaming_worker.train(tmp_path / "ckpt", tmp_path / "missing", SIZES)
    with pytest.raises(ValueError, match="slow must be >= 0"):
        streaming_worker.train(tmp_path / "ckpt", shards, SIZES, slow=-1)
    with pytest.raises(ValueError, match="--out .*: its parent .*no does not exist"):
        streaming_worker.main([str(tmp_path / "ckpt"), "--shards", str(shards), "--sizes",
                               workers.sizes_json(streaming=SIZES), "--out",
                               str(tmp_path / "no" / "f.npz")])  # fmt: skip
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "no").exists()
