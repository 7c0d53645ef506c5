"""Chapter 15: text in shards on disk, streamed by Grain, prefetched to the device.

A record is one window of T + 1 characters of chapter 11's corpus (`jaxloops.text`), stored
as uint8 token ids (V = 96 < 256) in `.npy` shards. Grain reads them through a random-access
source, shuffles them with a seed, repeats them for the epochs and batches them; the host
then decodes each batch into the chapter-5 MLP's inputs: the T context characters one-hot,
(B, T * V) float32, and the character that follows, (B,), as the class (C = V).
"""

import contextlib
import dataclasses
import functools
import itertools
import pathlib
import zlib
from typing import NamedTuple

import grain
import jax
import numpy as np

from jaxloops.data import Batch
from jaxloops.loop import python_loop
from jaxloops.paths import existing_directory, writable_directory
from jaxloops.text import VOCAB_SIZE

SHARD_PATTERN = "shard_*.npy"


def write_shards(directory, tokens, context: int, records_per_shard: int) -> list[pathlib.Path]:
    """Cuts `tokens` into non-overlapping windows of `context` + 1 ids, written in order as
    shards of `records_per_shard` windows each (the last may be shorter).

    Args:
      directory: created if missing; its parent must exist and be writable.
    Returns:
      The shard files, in order: shard_00000.npy, shard_00001.npy, ...
    """
    tokens = np.asarray(tokens)
    if context < 1 or records_per_shard < 1:
        raise ValueError(f"need context >= 1 and records_per_shard >= 1, got {context}, "
                         f"{records_per_shard}")  # fmt: skip
    directory = writable_directory(directory, "shard directory")
    records = tokens.shape[0] // (context + 1)
    if records == 0:
        raise ValueError(f"{tokens.shape[0]} tokens hold no window of {context} + 1 tokens")
    windows = tokens[: records * (context + 1)].reshape(records, context + 1).astype(np.uint8)
    directory.mkdir(exist_ok=True)
    paths = []
    for i, start in enumerate(range(0, records, records_per_shard)):
        paths.append(directory / f"shard_{i:05d}.npy")
        np.save(paths[-1], windows[start : start + records_per_shard])  # (records, T + 1)
    return paths


class ShardedWindows:
    """Grain's random-access source protocol (`__len__`, `__getitem__`) over the shards of
    `write_shards`: record i is found by its shard's first index, read from a memory map."""

    def __init__(self, directory):
        self.directory = existing_directory(directory, "shard directory")
        files = sorted(self.directory.glob(SHARD_PATTERN))
        self._shards = [np.load(path, mmap_mode="r") for path in files]
        counts = [len(shard) for shard in self._shards]
        if sum(counts) == 0:
            raise ValueError(
                f"{self.directory} has no records: {len(files)} files match {SHARD_PATTERN}, "
                f"holding {sum(counts)} windows"
            )
        self._first = np.cumsum([0] + counts)  # index of each shard's first record
        # What identifies the records cheaply: their counts, and a CRC of every shard's name,
        # count and first and last record (a changed or reordered shard changes it).
        crc = 0
        for path, shard in zip(files, self._shards):
            for part in (path.name.encode(), str(len(shard)).encode(), shard[:1], shard[-1:]):
                crc = zlib.crc32(np.ascontiguousarray(part).tobytes(), crc)
        self.fingerprint = {
            "records": int(sum(counts)),
            "record_length": int(self._shards[0].shape[1]),
            "shards": len(files),
            "crc32": crc,
        }

    def __len__(self) -> int:
        return int(self._first[-1])

    def __getitem__(self, index: int) -> np.ndarray:
        shard = int(np.searchsorted(self._first, index, side="right")) - 1
        return np.asarray(self._shards[shard][index - self._first[shard]])  # (T + 1,) uint8


def decode(records: np.ndarray) -> Batch:
    """A batch of windows (B, T + 1) -> Batch(x (B, T * V) one-hot float32, y (B,) int32)."""
    context = records[:, :-1].astype(np.int64)  # (B, T)
    x = np.zeros((records.shape[0], context.shape[1], VOCAB_SIZE), np.float32)  # (B, T, V)
    np.put_along_axis(x, context[..., None], 1.0, axis=-1)
    return Batch(x.reshape(records.shape[0], -1), records[:, -1].astype(np.int32))


def text_batches(source, *, seed: int, batch_size: int, epochs: int) -> grain.MapDataset:
    """The training stream: records shuffled (a new order each epoch, from `seed`),
    repeated `epochs` times, cut into batches of `batch_size` (a batch may span two epochs;
    the last short one is dropped) and decoded. Indexable: batch i is the same every time."""
    if not 1 <= batch_size <= len(source) or epochs < 1:
        raise ValueError(f"need 1 <= batch_size <= {len(source)} records and epochs >= 1, "
                         f"got {batch_size}, {epochs}")  # fmt: skip
    dataset = grain.MapDataset.source(source).shuffle(seed=seed).repeat(epochs)
    return dataset.batch(batch_size, drop_remainder=True).map(decode)


def unprefetched(dataset: grain.MapDataset) -> grain.DatasetIterator:
    """An iterator that makes each batch when it is asked for, on the calling thread."""
    options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return iter(dataset.to_iter_dataset(options))


def prefetched(dataset: grain.MapDataset, device, buffer: int = 2) -> grain.DatasetIterator:
    """An iterator of batches already on `device`: a background thread makes up to `buffer`
    batches ahead, a second one copies up to `buffer` of them to the device (with 2, double
    buffering: one batch in use by the step, the next one arriving)."""
    if buffer < 1:
        raise ValueError(f"buffer must be >= 1 batch, got {buffer}")
    options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    stream = dataset.to_iter_dataset(options)
    return iter(
        grain.experimental.device_put(
            stream, device, cpu_buffer_size=buffer, device_buffer_size=buffer
        )
    )


def stream_fingerprint(source: ShardedWindows, *, seed: int, batch_size: int, epochs: int):
    """What a saved iterator position means something for: these records, in this order."""
    return {**source.fingerprint, "seed": seed, "batch_size": batch_size, "epochs": epochs}


def check_iterator_state(state: dict, fingerprint: dict, saved_fingerprint: dict, batches: int):
    """Raises ValueError unless a saved iterator state fits this stream: the same records,
    seed, batch size and epochs (`stream_fingerprint`), and a position in its `batches`."""
    differ = sorted(
        name
        for name in saved_fingerprint.keys() | fingerprint.keys()
        if saved_fingerprint.get(name) != fingerprint.get(name)
    )
    if differ:
        raise ValueError(
            "the checkpoint's iterator state is for another dataset: "
            + "; ".join(
                f"{name} {saved_fingerprint.get(name)} saved, {fingerprint.get(name)} here"
                for name in differ
            )
        )
    if not 0 <= state.get("next_index", -1) <= batches:
        raise ValueError(f"the checkpoint's iterator state {state} is outside [0, {batches}]")


@dataclasses.dataclass(frozen=True)
class Feeds:
    """The four runs of the prefetch experiment, each `() -> final params`."""

    on_device: object  # batches already on the device, no host work (d per step)
    streamed: object  # each batch made when the loop asks for it (h + d)
    prefetched: object  # made and copied ahead by background threads (max(h, d) at best)
    host_alone: object  # the pipeline without the steps (h)


def feeds(step, params, opt_state, dataset: grain.MapDataset, steps: int, device) -> Feeds:
    """Drives the jitted `step` for `steps` steps from each feed, reading the loss every step
    (as a loop that logs it does: the host waits for each step)."""
    if not 1 <= steps <= len(dataset):
        raise ValueError(f"steps must be in [1, {len(dataset)}] (its batches), got {steps}")
    jitted = jax.jit(step)
    on_device = [jax.device_put(dataset[i], device) for i in range(steps)]
    run = lambda batches: python_loop(jitted, params, opt_state, batches, 1)[0]
    put = lambda batches: (jax.device_put(batch, device) for batch in batches)
    return Feeds(
        on_device=lambda: run(on_device),
        streamed=lambda: run(put(itertools.islice(unprefetched(dataset), steps))),
        prefetched=lambda: run(itertools.islice(prefetched(dataset, device), steps)),
        # h: what the host does for a batch in the streamed loop, making it and copying it
        host_alone=lambda: jax.block_until_ready(
            list(put(itertools.islice(unprefetched(dataset), steps)))
        ),
    )


def in_a_worker_process(dataset: grain.MapDataset, buffer: int = 2) -> grain.DatasetIterator:
    """An iterator of host batches made in one worker process (Grain's `mp_prefetch`), up to
    `buffer` ahead: the pipeline's Python runs under that process's interpreter lock, not
    under the loop's. The worker starts on the first `next()` and stops when the iterator
    is closed (`close()`) or garbage-collected."""
    if buffer < 1:
        raise ValueError(f"buffer must be >= 1 batch, got {buffer}")
    from absl import flags  # Grain reads its options as absl flags, unparsed in a notebook

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    workers = grain.MultiprocessingOptions(num_workers=1, per_worker_buffer_size=buffer)
    return iter(dataset.to_iter_dataset(options).mp_prefetch(workers))


@contextlib.contextmanager
def warm_prefetch(step, params, opt_state, dataset: grain.MapDataset, steps: int, device):
    """The GIL control of the prefetch experiment: two iterators over the stream repeated
    without end, started (first batch taken) before any timing, from which each call takes
    its next `steps` batches and drives `steps` steps of the jitted `step`, reading the loss
    every step: "threads" (`prefetched`) and "process" (`in_a_worker_process`, its batches
    copied to the device by the loop). Yields {name: () -> final params}; closes both
    iterators (stopping the worker) on leaving."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    jitted = jax.jit(step)
    endless = dataset.repeat()
    iterators = {"threads": prefetched(endless, device), "process": in_a_worker_process(endless)}
    put = {"threads": lambda batch: batch, "process": lambda batch: jax.device_put(batch, device)}

    def run(name):
        batches = (put[name](batch) for batch in itertools.islice(iterators[name], steps))
        return python_loop(jitted, params, opt_state, batches, 1)[0]

    try:
        for iterator in iterators.values():
            next(iterator)  # the worker and the threads started, their buffers filling
        yield {name: functools.partial(run, name) for name in iterators}
    finally:
        for iterator in iterators.values():
            iterator.close()


class StreamRun(NamedTuple):
    """The chapter's run: the stream, its fingerprint, fresh state and the pure step."""

    dataset: grain.MapDataset
    fingerprint: dict
    init: object  # () -> (params, opt_state), the same values every call
    train_step: object


def stream_run(shards, sizes, *, seed: int = 0) -> StreamRun:
    """The MLP of `sizes` (a `StreamingSizes`) on the shards in directory `shards`.

    The same every time: the records' order comes from `seed`, the weights from key 0.
    """
    from jaxloops.mlp import init_mlp, mlp_loss
    from jaxloops.train import make_optimizer, make_train_step

    source = ShardedWindows(shards)
    dataset = text_batches(source, seed=seed, batch_size=sizes.batch_size, epochs=sizes.epochs)
    fingerprint = stream_fingerprint(
        source, seed=seed, batch_size=sizes.batch_size, epochs=sizes.epochs
    )
    widths = (sizes.context * VOCAB_SIZE, *sizes.hidden, VOCAB_SIZE)
    optimizer = make_optimizer(3e-3, 1e-2)

    def init():
        params = init_mlp(jax.random.key(0), widths)
        return params, optimizer.init(params)

    return StreamRun(dataset, fingerprint, init, make_train_step(mlp_loss, optimizer))
