"""The one place that sizes every experiment for the backend JAX finds.

`experiment_sizes()` composes one frozen dataclass per part of the book; a chapter reads
`sizes.loop.batch_size`, `sizes.attention.lengths`, `sizes.lm.num_layers`. A new chapter adds
its own part here, once: each size written once, `By(cpu, gpu, tpu)` where backends differ.

The columns are planned from the machines they run on. CPU: seconds per chapter on a laptop.
GPU: one H200 (141 GiB). TPU: one v5e chip (15.75 GiB of HBM, 169 TFLOP/s measured in bf16,
551 GB/s read): the biggest experiments approach its limits (attention to T = 16384, where
XLA's scores would need more memory than the chip has; a transformer step of 89 M
parameters), each chapter inside about 90 s.
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
    stop_hidden: tuple[int, ...]  # chapter 7: the early-stopping run's hidden widths

    @property
    def stop_widths(self) -> tuple[int, ...]:
        """The early-stopping run's layer widths (chapter 7)."""
        return (NUM_FEATURES, *self.stop_hidden, NUM_CLASSES)


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
    decode_heads: int  # N of the decode sweep: K = N, N // 4, 1 read 1, 1/4, 1/N of MHA's bytes
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
    fit_batch: int  # B at which that table searches for the largest L


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
    resume_hidden: tuple[int, ...]  # hidden widths of that run, on the CPU on every backend
    nnx_steps: int  # N, steps of the NNX and pytree runs compared


@dataclasses.dataclass(frozen=True)
class KernelSizes:
    """Chapter 17: the attention kernel in Pallas, interpreted on a CPU (and a GPU, where the
    TPU kernels do not compile), compiled on a TPU."""

    batch: int  # B of the page's checks against naive attention
    heads: int  # N
    kv_heads: int  # K, K < N: grouped-query attention
    length: int  # T = S of the checks, a multiple of `block`
    head_dim: int  # H
    block: int  # Tb = Sb of the checks
    count_lengths: tuple[int, ...]  # T = S of the block-count table (the TPU run's lengths)
    vmem_blocks: tuple[int, ...]  # Tb = Sb of the VMEM table


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
    kernel: KernelSizes


@dataclasses.dataclass(frozen=True)
class By:
    """A size that differs by backend: its CPU, GPU and TPU values (tpu=None: the GPU's)."""

    cpu: object
    gpu: object
    tpu: object = None


BACKENDS = ("cpu", "gpu", "tpu")


def _per_backend(part: type, **values):
    """(the CPU part, the GPU part, the TPU part) of class `part`: a `By` value is split, any
    other is the same on all three."""

    def pick(backend):
        def value(v):
            if not isinstance(v, By):
                return v
            return v.gpu if backend == "tpu" and v.tpu is None else getattr(v, backend)

        return part(**{k: value(v) for k, v in values.items()})

    return tuple(pick(backend) for backend in BACKENDS)


# Each size once, the backends side by side: `By(cpu, gpu, tpu)` where they differ.
_PARTS = dict(
    measure=_per_backend(
        MeasureSizes,
        repeats=By(5, 20),
        matmul_size=By(1024, 8192),
    ),
    loop=_per_backend(
        LoopSizes,
        hidden=By((256, 256), (1024, 1024)),
        batch_size=128,
        epochs=30,
        learning_rate=3e-3,
        weight_decay=1e-2,
        # TPU: chapter 6 runs its overlap experiment at the largest batch and sweeps every
        # batch at two widths, each point a compile. At the GPU's sizes (100 steps, batch
        # 32768, 2.25 ms a step) the overlap cell alone took 126 s of the chapter's 150 on the
        # chip (2026-12-06); its work scales with steps x step time, so 40 steps at batch 8192
        # do about a tenth of it (a fifth at float32's "highest" precision), and 3 batches
        # compile 6 epochs, not 10.
        throughput_batch_sizes=By((32, 128, 512), (128, 512, 2048, 8192, 32768), (128, 1024, 8192)),
        # CPU: enough that one call's overhead is small against the steps; GPU steps take
        # microseconds: amortise the per-call dispatch
        throughput_steps=By(40, 100, 40),
        warmup_epochs=2,
        validation_fraction=0.15,
        # Chapter 7's early-stopping run is the same on every backend: where the validation
        # loss turns depends on the digits and the model, not on the device. At the
        # accelerators' (1024, 1024), 3 epochs a validation and a patience of 2, the
        # validation loss still fell at epoch 30 (0.160 at epoch 3, 0.101 at 30; the TPU run
        # of 2026-12-06 and this CPU at those sizes alike), so nothing stopped. Validating
        # after every epoch costs a dispatch and a host sync per epoch: chapter 7 measures it.
        validate_every=1,
        patience=4,
        stop_hidden=(256, 256),
    ),
    attention=_per_backend(
        AttentionSizes,
        lengths=By(
            (256, 512, 1024, 2048, 4096),
            (512, 1024, 2048, 4096, 8192, 16384),
            (1024, 2048, 4096, 8192, 16384),
        ),
        heads=By(4, 8),
        head_dim=64,
        block_size=512,
        # TPU: naive's (B, N, T, S) scores at T = 8192 need 8 GiB in float32 and XLA's attention ran
        # out of the chip's 15.75 GiB there (2026-12-06): compiled, not run, beyond 4096
        materialise_max_length=By(4096, 8192, 4096),
        fused_dtypes=By((), ("bfloat16", "float16"), ("bfloat16",)),  # TPU: no cuDNN; XLA in bf16
        repeats=By(3, 20),
        causal_lengths=By((512, 1024, 2048), (1024, 2048, 4096, 8192, 16384)),
        decode_cache_lengths=By((512, 1024, 2048, 4096, 8192), (1024, 4096, 16384, 65536)),
        decode_batch=By(4, 16),
        decode_dtype=By("float32", "bfloat16"),
        decode_heads=16,
        decode_steps=By(16, 64),
    ),
    lm=_per_backend(
        LanguageModelSizes,
        text_bytes=By(2**20, 3 * 2**20),
        num_layers=By(2, 4),
        model_dim=By(64, 256),
        num_heads=By(4, 8),
        num_kv_heads=2,
        hidden_dim=By(256, 1024),
        max_len=By(64, 256),
        batch_size=By(16, 32),
        steps=By(400, 2000),
        eval_every=By(50, 100),
        eval_windows=By(128, 512),
        learning_rate=By(3e-3, 1e-3),
        weight_decay=0.1,
        decode_batch=8,
        # The model trained is the GPU's on the TPU too: at L 6, D 512, T 512 its 2,000 steps took
        # 96 s there (2026-12-06), past a chapter's 90 s. The step timed is 89 M parameters at
        # T 1024 (114,000 tokens/s in float32 there).
        speed=By(
            (2, 128, 4, 2, 512, 128, 16),
            (4, 256, 8, 2, 1024, 256, 16),
            (8, 1024, 16, 4, 4096, 1024, 8),
        ),
    ),
    sharding=_per_backend(
        ShardingSizes,
        devices=8,  # 8 GPUs of one host, or 8 simulated CPU devices where fewer are found
        hidden=By((256, 256), (1024, 1024)),
        batch_size=By(128, 512),
        examples=1344,  # the digits training split has 1347 rows; 1344 = 168 x 8
        epochs=By(3, 10),
        learning_rate=3e-3,
        weight_decay=1e-2,
        stack_layers=By(4, 8),
        stack_width=By(64, 256),
        stack_hidden=By(128, 1024),
        stack_batch=By(64, 256),
        grid=(4, 2),
    ),
    checkpoint=_per_backend(
        CheckpointSizes,
        epochs=By(4, 20),
        stop_epoch=By(2, 8),
        kill_epoch=By(2, 5),
        keep_last=3,
        lm_text_bytes=By(2**16, 2**20),
        lm_windows=By(64, 1024),
    ),
    memory=_per_backend(
        MemorySizes,
        layers=By(4, 8),
        batch_size=By(8, 32),
        seq_len=By(64, 256),
        sweep_batches=By((2, 8), (8, 32)),
        sweep_lengths=By((16, 64), (64, 256)),
        # TPU: each point compiles a train step, 4-10 s each there (the GPU's eight points
        # spent 47 s of chapter 14's run on the chip, 2026-12-06); at L 8 the point is the
        # chapter's own unrolled step, which its remat section compiles anyway
        sweep_layers=By((1, 4), (1, 2, 4, 8), (1, 8)),
        # the unrolled compile grows ~3x from 2 to 24 layers, the scanned not; at 2 the
        # scanned program takes ~2x the unrolled one to compile (one build: 1.85, 0.86 s).
        # TPU: from the chapter's L 8, whose two programs the remat section compiles: XLA:TPU's
        # scanned program has 1,878 instructions at L 8, 1,889 at 16 (1,898 at 4: 1.1 % off
        # L 8's), the unrolled one 1.9x as many at 16 (compiled ahead of time for a v5e)
        compile_layers=By((2, 24), (8, 32), (8, 16)),
        micro_batches=(1, 4),
        train_steps=By(30, 200),
        text_bytes=By(2**16, 2**20),
        # TPU: half the chip's 15.75 GiB. Near the whole chip XLA rematerialises on its own to
        # fit, and the search's no-technique probes then fit where the formula says they
        # cannot (compiled ahead of time for a v5e at 15 GiB, 2026-12-06)
        budget_mib=By(16, 4096, 8 * 1024),
        # The search over L compiles the unrolled step (no technique; bfloat16) at the deepest L
        # that fits: at the chip's B 32 and 8 GiB the formula allows 42 blocks and more, each
        # probe a long compile there; at B 80, 17 and 34, and the chapter's L 8 still fits
        # without remat (the search's first compile) below a margin of about 1.9 over the
        # formula. The GPU's 4 GiB at B 48 alike. Remat's scanned steps compile alike at any L.
        fit_batch=By(8, 48, 80),
    ),
    streaming=_per_backend(
        StreamingSizes,
        # TPU: at the GPU's sizes the chip's step took d = 1.6 ms against h = 43 ms of host work
        # for a batch of 1,024 windows (2026-12-06), so prefetch had nothing to hide the host
        # behind, and timing the feeds took 84 s of chapter 15's 150. The host's work grows
        # with the batch (about 4 ms for 128 windows there), the step with the parameters: at
        # 12288 wide (171 M, 5.8 GB read and written a step by XLA's count) the step is about
        # 11 ms, as on a CPU a step outlasts the making of a batch, and the text is cut to a
        # quarter so the run killed and resumed on the host's CPU has 216 steps, not 867.
        text_bytes=By(2**16, 2**20, 2**18),
        context=By(8, 16),
        records_per_shard=By(1000, 8192, 2048),
        hidden=By((512, 512), (2048, 2048), (12288, 12288)),
        batch_size=By(128, 1024, 128),
        epochs=2,
        feed_steps=By(12, 50),
        rounds=By(7, 7, 5),
        save_every=By(10, 20),
        kill_step=By(70, 80),
        # The killed and resumed run is on the CPU everywhere: the CPU's model on every backend
        resume_hidden=(512, 512),
        nnx_steps=By(20, 50),
    ),
    kernel=_per_backend(
        KernelSizes,
        # CPU and GPU: Pallas's TPU interpreter runs a grid step at a time (about 10 ms each on
        # the 2-core CPU), so a few dozen steps a kernel; TPU: compiled, naive attention's
        # (B, N, T, S) float32 scores at 256 MiB beside it
        batch=By(1, 1, 2),
        heads=By(4, 4, 8),
        kv_heads=2,
        length=By(384, 384, 2048),
        head_dim=By(64, 64, 128),
        block=By(128, 128, 512),
        count_lengths=(1024, 4096, 8192, 16384),
        vmem_blocks=(128, 256, 512, 1024),
    ),
)
_SIZES = {backend: Sizes(backend, **{name: parts[i] for name, parts in _PARTS.items()})
          for i, backend in enumerate(BACKENDS)}  # fmt: skip


def experiment_sizes(backend: str | None = None) -> Sizes:
    """Returns the experiment sizes for `backend` (default: JAX's default backend).

    Args:
      backend: "cpu", "gpu" or "tpu"; None asks JAX which backend it found.
    """
    backend = jax.default_backend() if backend is None else backend
    if backend in ("cuda", "rocm"):
        return dataclasses.replace(_SIZES["gpu"], backend=backend)
    if backend not in _SIZES:
        raise ValueError(f"unknown backend {backend!r}; expected 'cpu', 'gpu' or 'tpu'")
    return _SIZES[backend]
