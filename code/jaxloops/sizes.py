"""The one place that sizes every experiment for the backend JAX finds.

`experiment_sizes()` composes one frozen dataclass per part of the book; a chapter reads
`sizes.loop.batch_size`, `sizes.attention.lengths`, `sizes.lm.num_layers`. A new chapter adds
its own part here, once: each size written once, `CpuGpu(cpu, gpu)` where the two differ.
"""

import dataclasses

import jax

from jaxloops.data import NUM_CLASSES, NUM_FEATURES


class _DigitsMLP:
    """Sizes of the digits MLP (a part with `hidden` widths)."""

    hidden: tuple[int, ...]

    @property
    def widths(self) -> tuple[int, ...]:
        """The MLP's layer widths: the digits' features, the hidden widths, the classes."""
        return (NUM_FEATURES, *self.hidden, NUM_CLASSES)


@dataclasses.dataclass(frozen=True)
class MeasureSizes:
    """How hard to measure: timing repeats and the roofline's matmul."""

    repeats: int  # timed calls per measurement (median reported)
    matmul_size: int  # n of the (n x n) @ (n x n) matmul that measures the FLOP/s ceiling


@dataclasses.dataclass(frozen=True)
class LoopSizes(_DigitsMLP):
    """Chapters 2-7: the digits MLP and its training loop."""

    hidden: tuple[int, ...]  # hidden widths F of the MLP
    batch_size: int  # B
    epochs: int
    learning_rate: float
    weight_decay: float
    throughput_batch_sizes: tuple[int, ...]  # B of chapter 6's sweep
    throughput_steps: int  # steps per timed call of the sweep
    warmup_epochs: int  # chapter 5's schedule: linear warm-up over this many epochs
    validation_fraction: float  # chapter 7: share of the digits held out for validation
    validate_every: int  # chapter 7: epochs per compiled call, a validation after each
    patience: int  # chapter 7: validations without a new best before stopping early


@dataclasses.dataclass(frozen=True)
class AttentionSizes:
    """Chapters 8-10: attention, causal masks, heads and the KV cache."""

    lengths: tuple[int, ...]  # T = S of the attention sweeps
    heads: int  # N
    head_dim: int  # H
    block_size: int  # blockwise attention's query and key block
    materialise_max_length: int  # longest T = S at which naive and XLA are run
    fused_dtypes: tuple[str, ...]  # dtypes the sweep requests cuDNN (and XLA) in
    repeats: int  # timed calls per point of the sweeps
    causal_lengths: tuple[int, ...]  # T = S of the causal sweep
    decode_cache_lengths: tuple[int, ...]  # S of the decode sweep
    decode_batch: int  # B of the decode sweep
    decode_dtype: str
    decode_heads: int  # N of the decode sweep: K = N, N // 8, 1 read 1, 1/8, 1/N of MHA's bytes
    decode_steps: int  # decode steps per timed call, so per-call overhead is spread thin


@dataclasses.dataclass(frozen=True)
class LanguageModelSizes:
    """Chapter 11: the character-level transformer, in `TransformerConfig`'s words (its
    `TransformerConfig.from_sizes` builds the model from them)."""

    text_bytes: int  # bytes of standard-library source read (train + validation)
    num_layers: int  # L
    model_dim: int  # D
    num_heads: int  # N
    num_kv_heads: int  # K
    hidden_dim: int  # F
    max_len: int  # T of training, and the length of the position table
    batch_size: int  # B
    steps: int  # train steps in all
    eval_every: int  # train steps between validation losses
    eval_windows: int  # validation windows each time
    learning_rate: float
    weight_decay: float
    decode_batch: int  # sequences generated at once
    speed: tuple[int, ...]  # (L, D, N, K, F, T, B) of the train step chapter 11 times
    # (L, D, N, K, F, T, B) at which chapter 11 checks its step's speed goals (two free CPU cores)
    goal: tuple[int, ...] = (4, 256, 8, 2, 1024, 256, 16)


@dataclasses.dataclass(frozen=True)
class ShardingSizes(_DigitsMLP):
    """Chapter 12: the digits MLP, data parallel and FSDP over a mesh of devices."""

    devices: int  # n, the size of the mesh's "data" axis (simulated CPU devices on a CPU)
    hidden: tuple[int, ...]  # hidden widths F of the MLP
    batch_size: int  # global B, split over the n devices
    examples: int  # training rows used, divisible by n
    epochs: int
    learning_rate: float
    weight_decay: float
    stack_layers: int  # L of the stacked residual MLP (FSDP per layer, tensor parallel)
    stack_width: int  # its D, divisible by n
    stack_hidden: int  # its F, divisible by the model axis
    stack_batch: int  # its global B, divisible by n
    grid: tuple[int, int]  # (data, model) of the 2-D mesh, product n


@dataclasses.dataclass(frozen=True)
class CheckpointSizes:
    """Chapter 13: the runs that are stopped, killed and resumed (the MLP of part `loop`, a
    transformer of part `lm`'s shape trained on a fixed set of windows)."""

    epochs: int  # N, the epochs of every uninterrupted run
    stop_epoch: int  # k: the stopped run saves after epoch k and exits
    kill_epoch: int  # the killed run is killed once epoch kill_epoch is saved
    keep_last: int  # checkpoints kept besides the best (>= 3: chapter 13 breaks the newest two)
    lm_text_bytes: int  # standard-library text the transformer's windows are cut from
    lm_windows: int  # training windows (examples) of the transformer


@dataclasses.dataclass(frozen=True)
class MemorySizes:
    """Chapter 14: what a train step keeps in memory (the transformer of part `lm`'s widths)."""

    layers: int  # L of the chapter's model
    batch_size: int  # B
    seq_len: int  # T
    sweep_batches: tuple[int, ...]  # B of the formula-against-compiled sweep
    sweep_lengths: tuple[int, ...]  # T of that sweep
    sweep_layers: tuple[int, ...]  # L of that sweep
    compile_layers: tuple[int, ...]  # L of the compile-time figure (unrolled against scanned)
    micro_batches: tuple[int, ...]  # M of the accumulation sweep (each divides batch_size)
    train_steps: int  # steps of the precision runs
    text_bytes: int  # standard-library text the training windows are cut from
    budget_mib: int  # the memory budget of the biggest-model table


@dataclasses.dataclass(frozen=True)
class StreamingSizes:
    """Chapters 15-16: chapter 11's text in shards, streamed by Grain into the chapter-5 MLP
    (T context characters one-hot in, the next one out), and the same step in Flax NNX."""

    text_bytes: int  # standard-library text cut into windows of T + 1 characters
    context: int  # T, characters the MLP sees
    records_per_shard: int  # windows per shard file
    hidden: tuple[int, ...]  # hidden widths F of the MLP
    batch_size: int  # B
    epochs: int  # passes over the records in a run
    feed_steps: int  # steps per timed run of each feed
    rounds: int  # timed rounds of the feeds, taken in turn
    save_every: int  # steps between checkpoints of the resumable run
    kill_step: int  # the killed run is killed once this step's checkpoint is saved
    nnx_steps: int  # N, steps of the NNX and pytree runs compared


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Experiment sizes for one backend, one part per group of chapters."""

    backend: str
    measure: MeasureSizes
    loop: LoopSizes
    attention: AttentionSizes
    lm: LanguageModelSizes
    sharding: ShardingSizes
    checkpoint: CheckpointSizes
    memory: MemorySizes
    streaming: StreamingSizes


@dataclasses.dataclass(frozen=True)
class CpuGpu:
    """A size that differs by backend: its CPU value and its GPU (or TPU) value."""

    cpu: object
    gpu: object


def _cpu_and_gpu(part: type, **values):
    """(the CPU part, the GPU part) of class `part`: a `CpuGpu` value is split, any other is
    the same on both."""
    pick = lambda i: part(
        **{k: (v.cpu, v.gpu)[i] if isinstance(v, CpuGpu) else v for k, v in values.items()}
    )
    return pick(0), pick(1)


# Each size once, CPU and GPU side by side: `CpuGpu(cpu, gpu)` where they differ.
_PARTS = dict(
    measure=_cpu_and_gpu(
        MeasureSizes,
        repeats=CpuGpu(5, 20),
        matmul_size=CpuGpu(1024, 8192),
    ),
    loop=_cpu_and_gpu(
        LoopSizes,
        hidden=CpuGpu((256, 256), (1024, 1024)),
        batch_size=128,
        epochs=30,
        learning_rate=3e-3,
        weight_decay=1e-2,
        throughput_batch_sizes=CpuGpu((32, 128, 512), (128, 512, 2048, 8192, 32768)),
        # CPU: enough that one call's overhead is small against the steps; GPU steps take
        # microseconds: amortise the per-call dispatch
        throughput_steps=CpuGpu(40, 100),
        warmup_epochs=2,
        validation_fraction=0.15,
        # An epoch of 8 steps takes about a millisecond on a GPU: validating after each would
        # cost a dispatch and a host sync per millisecond (not measured on a GPU yet).
        validate_every=CpuGpu(1, 3),
        patience=CpuGpu(4, 2),
    ),
    attention=_cpu_and_gpu(
        AttentionSizes,
        lengths=CpuGpu((256, 512, 1024, 2048, 4096), (512, 1024, 2048, 4096, 8192, 16384)),
        heads=CpuGpu(4, 8),
        head_dim=64,
        block_size=512,
        materialise_max_length=CpuGpu(4096, 8192),
        fused_dtypes=CpuGpu((), ("bfloat16", "float16")),
        repeats=CpuGpu(3, 20),
        causal_lengths=CpuGpu((512, 1024, 2048), (1024, 2048, 4096, 8192, 16384)),
        decode_cache_lengths=CpuGpu((512, 1024, 2048, 4096, 8192), (1024, 4096, 16384, 65536)),
        decode_batch=CpuGpu(4, 16),
        decode_dtype=CpuGpu("float32", "bfloat16"),
        decode_heads=16,
        decode_steps=CpuGpu(16, 64),
    ),
    lm=_cpu_and_gpu(
        LanguageModelSizes,
        text_bytes=CpuGpu(2**20, 3 * 2**20),
        num_layers=CpuGpu(2, 4),
        model_dim=CpuGpu(64, 256),
        num_heads=CpuGpu(4, 8),
        num_kv_heads=2,
        hidden_dim=CpuGpu(256, 1024),
        max_len=CpuGpu(64, 256),
        batch_size=CpuGpu(16, 32),
        steps=CpuGpu(400, 2000),
        eval_every=CpuGpu(50, 100),
        eval_windows=CpuGpu(128, 512),
        learning_rate=CpuGpu(3e-3, 1e-3),
        weight_decay=0.1,
        decode_batch=8,
        speed=CpuGpu((2, 128, 4, 2, 512, 128, 16), (4, 256, 8, 2, 1024, 256, 16)),
    ),
    sharding=_cpu_and_gpu(
        ShardingSizes,
        devices=8,  # 8 GPUs of one host, or 8 simulated CPU devices where fewer are found
        hidden=CpuGpu((256, 256), (1024, 1024)),
        batch_size=CpuGpu(128, 512),
        examples=1344,  # the digits training split has 1347 rows; 1344 = 168 x 8
        epochs=CpuGpu(3, 10),
        learning_rate=3e-3,
        weight_decay=1e-2,
        stack_layers=CpuGpu(4, 8),
        stack_width=CpuGpu(64, 256),
        stack_hidden=CpuGpu(128, 1024),
        stack_batch=CpuGpu(64, 256),
        grid=(4, 2),
    ),
    checkpoint=_cpu_and_gpu(
        CheckpointSizes,
        epochs=CpuGpu(4, 20),
        stop_epoch=CpuGpu(2, 8),
        kill_epoch=CpuGpu(2, 5),
        keep_last=3,
        lm_text_bytes=CpuGpu(2**16, 2**20),
        lm_windows=CpuGpu(64, 1024),
    ),
    memory=_cpu_and_gpu(
        MemorySizes,
        layers=CpuGpu(4, 8),
        batch_size=CpuGpu(8, 32),
        seq_len=CpuGpu(64, 256),
        sweep_batches=CpuGpu((2, 8), (8, 32)),
        sweep_lengths=CpuGpu((16, 64), (64, 256)),
        sweep_layers=CpuGpu((1, 4), (1, 2, 4, 8)),
        # the unrolled compile grows ~3x from 2 to 24 layers, the scanned not; at 2 the
        # scanned program takes ~2x the unrolled one to compile (one build: 1.85, 0.86 s)
        compile_layers=CpuGpu((2, 24), (8, 32)),
        micro_batches=(1, 4),
        train_steps=CpuGpu(30, 200),
        text_bytes=CpuGpu(2**16, 2**20),
        budget_mib=CpuGpu(16, 4096),
    ),
    streaming=_cpu_and_gpu(
        StreamingSizes,
        text_bytes=CpuGpu(2**16, 2**20),
        context=CpuGpu(8, 16),
        records_per_shard=CpuGpu(1000, 8192),
        hidden=CpuGpu((512, 512), (2048, 2048)),
        batch_size=CpuGpu(128, 1024),
        epochs=2,
        feed_steps=CpuGpu(12, 50),
        rounds=CpuGpu(7, 7),
        save_every=CpuGpu(10, 20),
        kill_step=CpuGpu(70, 80),
        nnx_steps=CpuGpu(20, 50),
    ),
)
_CPU, _GPU = (Sizes(backend, **{name: pair[i] for name, pair in _PARTS.items()})
              for i, backend in enumerate(("cpu", "gpu")))  # fmt: skip


def experiment_sizes(backend: str | None = None) -> Sizes:
    """Returns the experiment sizes for `backend` (default: JAX's default backend).

    Args:
      backend: "cpu", "gpu" or "tpu"; None asks JAX which backend it found.
    """
    backend = jax.default_backend() if backend is None else backend
    if backend == "cpu":
        return _CPU
    if backend in ("gpu", "cuda", "rocm", "tpu"):
        return dataclasses.replace(_GPU, backend=backend)
    raise ValueError(f"unknown backend {backend!r}; expected 'cpu', 'gpu' or 'tpu'")
