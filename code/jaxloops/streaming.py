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
import statistics
import time
import zlib
from typing import NamedTuple

import grain
import jax
import numpy as np

from jaxloops.data import Batch
from jaxloops.loop import python_loop
from jaxloops.measure.profile import busy_seconds
from jaxloops.measure.throughput import core_shares, predicted_step_seconds
from jaxloops.measure.timing import interleaved_samples
from jaxloops.text import VOCAB_SIZE

SHARD_PATTERN = "shard_*.npy"


def write_shards(directory, tokens, context: int, records_per_shard: int) -> list[pathlib.Path]:
    """Cuts `tokens` into non-overlapping windows of `context` + 1 ids, written in order as
    shards of `records_per_shard` windows each (the last may be shorter).

    Returns:
      The shard files, in order: shard_00000.npy, shard_00001.npy, ...
    """
    tokens = np.asarray(tokens)
    if context < 1 or records_per_shard < 1:
        raise ValueError(f"need context >= 1 and records_per_shard >= 1, got {context}, "
                         f"{records_per_shard}")  # fmt: skip
    records = tokens.shape[0] // (context + 1)
    if records == 0:
        raise ValueError(f"{tokens.shape[0]} tokens hold no window of {context} + 1 tokens")
    windows = tokens[: records * (context + 1)].reshape(records, context + 1).astype(np.uint8)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, start in enumerate(range(0, records, records_per_shard)):
        paths.append(directory / f"shard_{i:05d}.npy")
        np.save(paths[-1], windows[start : start + records_per_shard])  # (records, T + 1)
    return paths


class ShardedWindows:
    """Grain's random-access source protocol (`__len__`, `__getitem__`) over the shards of
    `write_shards`: record i is found by its shard's first index, read from a memory map."""

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)
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


def step_phases(step, params, opt_state, batches, steps: int) -> dict[str, float]:
    """Where each step of a loop that reads its loss every step spends its time: the median
    seconds, over `steps` steps of the jitted `step` fed from the iterable `batches`, of
    "wait" (taking the next batch until it is on the device), "dispatch" (the jitted call,
    until it returns) and "compute" (from then until the loss is ready)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    jitted, batches = jax.jit(step), iter(batches)
    phases = {"wait": [], "dispatch": [], "compute": []}
    for _ in range(steps):
        start = time.perf_counter()
        batch = jax.block_until_ready(next(batches))
        taken = time.perf_counter()
        params, opt_state, metrics = jitted(params, opt_state, batch)
        dispatched = time.perf_counter()
        float(metrics["loss"])
        done = time.perf_counter()
        phases["wait"].append(taken - start)
        phases["dispatch"].append(dispatched - taken)
        phases["compute"].append(done - dispatched)
    return {name: statistics.median(seconds) for name, seconds in phases.items()}


def idle_share(spans) -> float:
    """Share of a trace's length during which no span of the "device" row was open."""
    length = max(span.end for span in spans) - min(span.start for span in spans)
    return 1.0 - busy_seconds(spans, "device") / length


def predicted_feed_seconds(
    host: float, device: float, steps: int, host_share: float, device_share: float
) -> dict[str, float]:
    """Seconds per step of each feed over `steps` steps, for host work h per batch and device
    work d per step (each timed alone), at the shares of their speed they keep beside each
    other (`measure.core_shares`). Streamed, the loop makes a batch, then waits for its step:
    h + d. Prefetched, the first batch is made before the first step; after it the threads
    make batch t + 1 while step t runs (chapter 6's `predicted_step_seconds` without fetches).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    overlapped = predicted_step_seconds(host, device, 1, host_share, device_share)["never fetch"]
    return {
        "on_device": device,
        "streamed": host + device,
        "prefetched": (host + device + (steps - 1) * overlapped) / steps,
    }


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


def time_feeds(runs: Feeds, device_work, *, rounds: int):
    """Seconds of every timed call of each feed (`measure.interleaved_samples`: the feeds
    in turn, `rounds` times) and the core shares (`measure.core_shares(device_work)`),
    the mean of one measurement before the rounds and one after."""
    named = {field.name: getattr(runs, field.name) for field in dataclasses.fields(runs)}
    jax.block_until_ready(device_work())  # compiled first: core_shares sizes its loops by it
    before = core_shares(device_work, tries=2)
    samples = interleaved_samples(named, rounds, warmup_each=0)
    after = core_shares(device_work, tries=2)
    return samples, tuple((a + b) / 2 for a, b in zip(before, after))


def serial_ratio(samples: dict[str, list[float]]) -> float:
    """The median over rounds of the streamed feed's time over h + d in the same round."""
    rounds = zip(samples["streamed"], samples["host_alone"], samples["on_device"], strict=True)
    return float(np.median([s / (h + d) for s, h, d in rounds]))


def feed_failures(samples: dict[str, list[float]], steps: int, band: float) -> list[str]:
    """What the timed feeds (`time_feeds`' samples, `steps` steps a call) contradict, each
    with its figures; empty when nothing does.

    The streamed feed must be within `band` (a fraction) of h + d: the median over rounds of
    its time over host_alone's plus on_device's in the same round, so that a slow moment of
    a shared machine divides out. The prefetched one (median) is held to what overlap can do
    at all, between full overlap, max(h, d), and none, h + d, widened by `band`: its own
    prediction rests on core shares measured before and after the rounds, not during them.
    """
    serial = serial_ratio(samples)
    h, d = (float(np.median(samples[name])) / steps for name in ("host_alone", "on_device"))
    prefetched = float(np.median(samples["prefetched"])) / steps
    failures = []
    if abs(serial - 1) > band:
        failures.append(f"streamed: {serial:.2f} times h + d, in the same rounds")
    low, high = (1 - band) * max(h, d), (1 + band) * (h + d)
    if not low <= prefetched <= high:
        failures.append(
            f"prefetched: measured {1e3 * prefetched:.2f} ms, outside "
            f"[{1e3 * low:.2f}, {1e3 * high:.2f}] ms (h = {1e3 * h:.2f}, d = {1e3 * d:.2f})"
        )
    return failures
