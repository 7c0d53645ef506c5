"""Facts about the machine that runs the book: one place for the pages, the results file and
the build-information page."""

import datetime
import os
import platform
import re
import shutil
import subprocess

import jax


def describe_backend() -> str:
    """One line naming the device that executes this process, e.g. for a page header."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        cores = os.cpu_count() or 0
        cpu = platform.processor() or platform.machine()
        return f"CPU ({cpu}, {cores} cores)"
    return f"{device.device_kind} ({device.platform.upper()})"


def run_label() -> str:
    """ "<device> with JAX <version>": what each page says about the run that produced it."""
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
    gpus = [
        [field.strip() for field in line.split(",")] for line in rows.splitlines() if line.strip()
    ]
    if not gpus:
        return {}
    facts = {
        "gpus": "; ".join(f"{name} ({memory})" for name, _, memory in gpus),
        "driver": gpus[0][1],
    }
    match = re.search(r"CUDA Version:\s*([\d.]+)", header)
    if match:
        facts["cuda_driver"] = match.group(1)  # the newest CUDA the driver supports
    try:  # what jaxlib's CUDA plugin loaded; a private module, so absent is not an error
        from jax._src.lib import cuda_versions

        if cuda_versions is not None:
            runtime, cudnn = (
                cuda_versions.cuda_runtime_get_version(),
                cuda_versions.cudnn_get_version(),
            )
            facts["cuda_runtime"] = f"{runtime // 1000}.{runtime % 1000 // 10}"
            facts["cudnn"] = f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}"
    except Exception:  # noqa: BLE001 - an older or newer jaxlib without these functions
        pass
    return facts


def machine_facts() -> dict[str, str]:
    """Everything a page, the build-information page or a results file says about the machine:
    date, device, backend, device count, OS, package versions and, on a GPU, driver, CUDA and
    cuDNN."""
    device = jax.devices()[0]
    facts = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": describe_backend(),
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "device_count": str(jax.device_count()),
        "os": platform.platform(),
    }
    facts.update(versions())
    facts.update(gpu_facts())  # GPUs, driver, CUDA and cuDNN; nothing on a CPU
    return facts
