"""Which device runs the book, and the one place that sizes experiments for it."""

import dataclasses
import os
import platform
import re
import shutil
import subprocess

import jax


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Experiment sizes for one backend. Chapters read these; none hard-codes a size.

    Fields are grouped by the chapter that uses them.
    """

    backend: str
    # Chapters 2-7: the digits MLP.
    hidden: tuple[int, ...]
    batch_size: int
    epochs: int
    learning_rate: float
    weight_decay: float
    throughput_batch_sizes: tuple[int, ...]
    throughput_steps: int
    matmul_size: int
    # Chapters 8-10: attention.
    attention_lengths: tuple[int, ...]
    attention_heads: int
    attention_head_dim: int
    decode_cache_lengths: tuple[int, ...]
    attention_block_size: int  # blockwise attention's query and key block
    attention_materialise_max_length: int  # longest L at which naive and XLA are run
    attention_fused_dtypes: tuple[str, ...]  # dtypes the sweep requests cuDNN (and XLA) in
    attention_repeats: int  # timed calls per point of the attention sweeps
    causal_lengths: tuple[int, ...]
    decode_batch: int
    decode_dtype: str
    # Chapter 11: the character-level transformer.
    lm_text_bytes: int  # bytes of standard-library source read (train + validation)
    lm_layers: int  # L
    lm_model_dim: int  # D
    lm_heads: int  # N
    lm_kv_heads: int  # K
    lm_hidden_dim: int  # F
    lm_seq_len: int  # T of training, and the length of the position table
    lm_batch_size: int  # B
    lm_steps: int  # train steps in all
    lm_eval_every: int  # train steps between validation losses
    lm_eval_windows: int  # validation windows each time
    lm_learning_rate: float
    lm_weight_decay: float
    lm_decode_batch: int  # sequences generated at once
    # Timing.
    repeats: int


_CPU = Sizes(
    backend="cpu",
    hidden=(256, 256),
    batch_size=128,
    epochs=30,
    learning_rate=3e-3,
    weight_decay=1e-2,
    throughput_batch_sizes=(32, 128, 512),
    throughput_steps=40,  # enough that one call's overhead is small against the steps
    matmul_size=1024,
    attention_lengths=(256, 512, 1024, 2048, 4096),
    attention_heads=4,
    attention_head_dim=64,
    decode_cache_lengths=(512, 1024, 2048, 4096, 8192),
    attention_block_size=256,
    attention_materialise_max_length=4096,
    attention_fused_dtypes=(),
    attention_repeats=3,
    causal_lengths=(512, 1024, 2048),
    decode_batch=8,
    decode_dtype="float32",
    lm_text_bytes=2**20,
    lm_layers=2,
    lm_model_dim=64,
    lm_heads=4,
    lm_kv_heads=2,
    lm_hidden_dim=256,
    lm_seq_len=64,
    lm_batch_size=16,
    lm_steps=400,
    lm_eval_every=50,
    lm_eval_windows=128,
    lm_learning_rate=3e-3,
    lm_weight_decay=0.1,
    lm_decode_batch=8,
    repeats=5,
)

_GPU = Sizes(
    backend="gpu",
    hidden=(1024, 1024),
    batch_size=128,
    epochs=30,
    learning_rate=3e-3,
    weight_decay=1e-2,
    throughput_batch_sizes=(128, 512, 2048, 8192, 32768),
    throughput_steps=100,  # GPU steps take microseconds: amortise the per-call dispatch
    matmul_size=8192,
    attention_lengths=(512, 1024, 2048, 4096, 8192, 16384),
    attention_heads=8,
    attention_head_dim=64,
    decode_cache_lengths=(1024, 4096, 16384, 65536),
    attention_block_size=512,
    attention_materialise_max_length=8192,
    attention_fused_dtypes=("bfloat16", "float16"),
    attention_repeats=20,
    causal_lengths=(1024, 2048, 4096, 8192, 16384),
    decode_batch=16,
    decode_dtype="bfloat16",
    lm_text_bytes=3 * 2**20,
    lm_layers=4,
    lm_model_dim=256,
    lm_heads=8,
    lm_kv_heads=2,
    lm_hidden_dim=1024,
    lm_seq_len=256,
    lm_batch_size=32,
    lm_steps=2000,
    lm_eval_every=100,
    lm_eval_windows=512,
    lm_learning_rate=1e-3,
    lm_weight_decay=0.1,
    lm_decode_batch=8,
    repeats=20,
)


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


def describe_backend() -> str:
    """One line naming the device that executes this process, e.g. for a page header."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        cores = os.cpu_count() or 0
        cpu = platform.processor() or platform.machine()
        return f"CPU ({cpu}, {cores} cores)"
    return f"{device.device_kind} ({device.platform.upper()})"


def run_label() -> str:
    """"<device> with JAX <version>": what each page says about the run that produced it."""
    return f"{describe_backend()} with JAX {jax.__version__}"


def versions() -> dict[str, str]:
    """Versions of the packages that produced the page's numbers."""
    import jaxlib
    import optax

    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "optax": optax.__version__,
    }


def gpu_facts(run=subprocess.run) -> dict[str, str]:
    """NVIDIA GPUs, driver, and the CUDA and cuDNN versions in use; {} when no GPU is present.

    Args:
      run: runs a command like `subprocess.run` (the tests pass a stand-in).
    """
    if shutil.which("nvidia-smi") is None:
        return {}
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        rows = run(query, capture_output=True, text=True, timeout=60, check=True).stdout
        header = run(["nvidia-smi"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    gpus = [[field.strip() for field in line.split(",")] for line in rows.splitlines() if line.strip()]
    if not gpus:
        return {}
    facts = {"gpus": "; ".join(f"{name} ({memory})" for name, _, memory in gpus), "driver": gpus[0][1]}
    match = re.search(r"CUDA Version:\s*([\d.]+)", header)
    if match:
        facts["cuda_driver"] = match.group(1)  # the newest CUDA the driver supports
    try:  # what jaxlib's CUDA plugin loaded; a private module, so absent is not an error
        from jax._src.lib import cuda_versions

        if cuda_versions is not None:
            runtime, cudnn = cuda_versions.cuda_runtime_get_version(), cuda_versions.cudnn_get_version()
            facts["cuda_runtime"] = f"{runtime // 1000}.{runtime % 1000 // 10}"
            facts["cudnn"] = f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}"
    except Exception:  # noqa: BLE001 - an older or newer jaxlib without these functions
        pass
    return facts
