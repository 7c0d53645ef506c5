"""Shards, the Grain stream, prefetch and the feeds' predictions (chapter 15).

Where grain is not installed, `pytest.importorskip` skips this module (the device run carries
its wheel: scripts/device_run.py, setup).
"""

import dataclasses
import multiprocessing

import numpy as np
import pytest

grain = pytest.importorskip("grain")

import jax  # noqa: E402

from jaxloops import streaming  # noqa: E402
from jaxloops.measure import feeds  # noqa: E402
from jaxloops.text import VOCAB_SIZE  # noqa: E402

CONTEXT, PER_SHARD, BATCH = 5, 7, 3


def odd_tokens(n=131):
    return (np.arange(n) * 7 + 3) % VOCAB_SIZE  # every window distinct


@pytest.fixture
def shards(tmp_path):
    streaming.write_shards(tmp_path / "shards", odd_tokens(), CONTEXT, PER_SHARD)
    return tmp_path / "shards"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The chapter's MLP run on shards of its own, made once for the module: its train step
    is then one function, and the tests that jit it share the compiled programs."""
    from jaxloops import experiment_sizes

    shards = tmp_path_factory.mktemp("stream") / "shards"
    streaming.write_shards(shards, odd_tokens(), CONTEXT, PER_SHARD)
    sizes = dataclasses.replace(
        experiment_sizes("cpu").streaming, context=CONTEXT, hidden=(11,), batch_size=BATCH
    )
    return streaming.stream_run(shards, sizes)


def test_shards_hold_the_windows_in_order(shards):
    source = streaming.ShardedWindows(shards)
    windows = odd_tokens()[: 21 * (CONTEXT + 1)].reshape(21, CONTEXT + 1)  # 131 // 6 = 21
    assert len(source) == 21 and source.fingerprint["shards"] == 3
    np.testing.assert_array_equal(np.stack([source[i] for i in range(21)]), windows)


def test_a_changed_shard_changes_the_fingerprint(shards):
    before = streaming.ShardedWindows(shards).fingerprint
    data = np.load(shards / "shard_00002.npy")
    np.save(shards / "shard_00002.npy", data[::-1])
    assert streaming.ShardedWindows(shards).fingerprint != before


def test_a_source_with_no_records_is_refused(tmp_path):
    with pytest.raises(ValueError, match="has no records: 0 files"):
        streaming.ShardedWindows(tmp_path)
    np.save(tmp_path / "shard_00000.npy", np.zeros((0, CONTEXT + 1), np.uint8))
    with pytest.raises(ValueError, match="has no records: 1 files"):
        streaming.ShardedWindows(tmp_path)


def test_bad_shard_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="context >= 1"):
        streaming.write_shards(tmp_path, odd_tokens(), 0, PER_SHARD)
    with pytest.raises(ValueError, match="no window of 5"):
        streaming.write_shards(tmp_path, odd_tokens(4), CONTEXT, PER_SHARD)


def test_decode_is_one_hot_context_and_the_next_token():
    records = odd_tokens(3 * (CONTEXT + 1)).reshape(3, CONTEXT + 1).astype(np.uint8)
    batch = streaming.decode(records)
    assert batch.x.shape == (3, CONTEXT * VOCAB_SIZE) and batch.x.sum() == 3 * CONTEXT
    np.testing.assert_array_equal(batch.x.reshape(3, CONTEXT, -1).argmax(-1), records[:, :-1])
    np.testing.assert_array_equal(batch.y, records[:, -1])


def test_the_stream_matches_an_in_memory_reference(shards):
    """Streamed from disk == the same windows held in memory, read in the order that the
    stream's shuffle gives record indices; every epoch is a new permutation of all."""
    source = streaming.ShardedWindows(shards)
    streamed = streaming.text_batches(source, seed=5, batch_size=BATCH, epochs=2)
    windows = np.stack([source[i] for i in range(len(source))])  # in memory
    order = grain.MapDataset.source(np.arange(len(source))).shuffle(seed=5).repeat(2)
    order = np.asarray([order[i] for i in range(2 * len(source))])
    for epoch in order.reshape(2, -1):
        assert sorted(epoch) == list(range(len(source)))
    assert not np.array_equal(order[:21], order[21:])  # a new order in the second epoch
    assert not np.array_equal(order[:21], np.arange(21))  # shuffled
    for i, batch in enumerate(streamed):
        want = streaming.decode(windows[order[i * BATCH : (i + 1) * BATCH]])
        np.testing.assert_array_equal(batch.x, want.x)
        np.testing.assert_array_equal(batch.y, want.y)
    assert i + 1 == len(streamed) == 2 * 21 // BATCH


def test_another_seed_gives_another_order(shards):
    source = streaming.ShardedWindows(shards)
    a, b = (streaming.text_batches(source, seed=s, batch_size=BATCH, epochs=1) for s in (1, 2))
    assert not np.array_equal(a[0].y, b[0].y) or not np.array_equal(a[1].y, b[1].y)


def test_bad_stream_sizes_are_refused(shards):
    source = streaming.ShardedWindows(shards)
    with pytest.raises(ValueError, match="batch_size <= 21"):
        streaming.text_batches(source, seed=0, batch_size=22, epochs=1)
    with pytest.raises(ValueError, match="epochs >= 1"):
        streaming.text_batches(source, seed=0, batch_size=BATCH, epochs=0)


def test_prefetched_batches_are_the_stream_on_the_device_and_count_what_was_taken(shards):
    dataset = streaming.text_batches(
        streaming.ShardedWindows(shards), seed=3, batch_size=BATCH, epochs=1
    )
    iterator = streaming.prefetched(dataset, jax.devices("cpu")[0])
    for i in range(4):
        batch = next(iterator)
        assert isinstance(batch.x, jax.Array)
        np.testing.assert_array_equal(np.asarray(batch.y), dataset[i].y)
    assert iterator.get_state() == {"next_index": 4}  # not what its threads read ahead


def test_iterator_state_from_another_stream_is_refused(shards):
    source = streaming.ShardedWindows(shards)
    mine = streaming.stream_fingerprint(source, seed=0, batch_size=BATCH, epochs=1)
    streaming.check_iterator_state({"next_index": 7}, mine, mine, 7)  # fits
    other = {**mine, "batch_size": BATCH + 1}
    with pytest.raises(ValueError, match="batch_size 4 saved, 3 here"):
        streaming.check_iterator_state({"next_index": 1}, mine, other, 7)
    with pytest.raises(ValueError, match=r"outside \[0, 7\]"):
        streaming.check_iterator_state({"next_index": 8}, mine, mine, 7)


def test_feeds_train_the_same_model_the_same_way(run):
    params, opt_state = run.init()
    runs = streaming.feeds(run.train_step, params, opt_state, run.dataset, 5, jax.devices()[0])
    results = [runs.on_device(), runs.streamed(), runs.prefetched()]
    for other in results[1:]:
        for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(other), strict=True):
            np.testing.assert_array_equal(a, b)
    assert len(runs.host_alone()) == 5


def test_warm_prefetch_feeds_the_same_batches_from_threads_and_from_a_worker_process(run):
    """Both started iterators skip the first batch (taken to start them) and then feed
    batches 1 .. steps: the loop over those batches, on the device, gives the same params."""
    from jaxloops.loop import python_loop

    params, opt_state = run.init()
    device = jax.devices()[0]
    batches = [jax.device_put(run.dataset[i], device) for i in (1, 2, 3)]
    want = python_loop(jax.jit(run.train_step), params, opt_state, batches, 1)[0]
    with streaming.warm_prefetch(run.train_step, params, opt_state, run.dataset, 3, device) as warm:
        assert len(multiprocessing.active_children()) == 1  # the worker, started
        for name in ("threads", "process"):
            for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(warm[name]()), strict=True):
                np.testing.assert_array_equal(a, b)
    assert multiprocessing.active_children() == []  # stopped on leaving


def test_step_phases_charges_a_slow_batch_to_the_wait(run):
    """A batch source that sleeps 300 ms before each batch: the wait holds the sleep, and the
    dispatch and the computation of a tiny step do not. (The sleep is the only bound: long
    enough that a loaded machine's tiny step, once 73 ms at nice 19 beside a book build,
    cannot reach it.)"""
    import time

    params, opt_state = run.init()
    batch = jax.device_put(run.dataset[0])

    def slow():
        while True:
            time.sleep(0.3)
            yield batch

    phases = feeds.step_phases(run.train_step, params, opt_state, slow(), steps=3)
    assert list(phases) == ["wait", "dispatch", "compute"]
    assert phases["wait"] >= 0.3 > max(phases["dispatch"], phases["compute"]), phases

    # Means, not medians: one batch 0.3 s late among three moves the wait by 0.1 s.
    def one_late():
        for delay in (0.0, 0.3, 0.0, 0.0):  # the first is the untimed warm-up step's
            time.sleep(delay)
            yield batch

    late = feeds.step_phases(run.train_step, params, opt_state, one_late(), steps=3)
    assert late["wait"] >= 0.1, late
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        feeds.step_phases(run.train_step, params, opt_state, slow(), steps=0)


def test_path_and_count_arguments_are_checked_before_any_work(run, tmp_path):
    (tmp_path / "a-file").write_text("")
    for bad, message in [
        (tmp_path / "a-file", "a-file is a file"),
        (tmp_path / "no" / "such", "parent .*no does not exist"),
    ]:
        with pytest.raises(ValueError, match=message):
            streaming.write_shards(bad, odd_tokens(), CONTEXT, PER_SHARD)
    with pytest.raises(ValueError, match="shard directory .*missing does not exist"):
        streaming.ShardedWindows(tmp_path / "missing")
    with pytest.raises(ValueError, match="a-file is a file"):
        streaming.ShardedWindows(tmp_path / "a-file")
    cpu, dataset = jax.devices("cpu")[0], run.dataset
    for buffer in (0, -1):
        with pytest.raises(ValueError, match=f"buffer must be >= 1 batch, got {buffer}"):
            streaming.prefetched(dataset, cpu, buffer)
        with pytest.raises(ValueError, match=f"buffer must be >= 1 batch, got {buffer}"):
            streaming.in_a_worker_process(dataset, buffer)
    for steps in (0, len(dataset) + 1):
        with pytest.raises(ValueError, match=f"steps must be in \\[1, {len(dataset)}\\]"):
            streaming.feeds(run.train_step, *run.init(), dataset, steps, cpu)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        with streaming.warm_prefetch(run.train_step, *run.init(), dataset, 0, cpu):
            pass
    assert not (tmp_path / "no").exists()
