import subprocess
from importlib import metadata

from jaxloops import measure
from jaxloops.measure import machine

QUERY = "NVIDIA H200, 570.124.06, 143771 MiB\nNVIDIA H200, 570.124.06, 143771 MiB\n"
HEADER = "| NVIDIA-SMI 570.124.06   Driver Version: 570.124.06   CUDA Version: 12.8     |\n"


def fake_run(outputs):
    def run(command, **kwargs):
        return subprocess.CompletedProcess(command, 0, stdout=outputs[len(command) > 1], stderr="")

    return run


def test_gpu_facts_is_empty_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(machine.shutil, "which", lambda name: None)
    assert measure.gpu_facts() == {}


def test_gpu_facts_reads_every_gpu_the_driver_and_its_cuda_version(monkeypatch):
    monkeypatch.setattr(machine.shutil, "which", lambda name: "/usr/bin/" + name)
    facts = measure.gpu_facts(run=fake_run({True: QUERY, False: HEADER}))
    assert facts["gpus"] == "NVIDIA H200 (143771 MiB); NVIDIA H200 (143771 MiB)"
    assert facts["driver"] == "570.124.06"
    assert facts["cuda_driver"] == "12.8"


def test_gpu_facts_is_empty_when_nvidia_smi_fails(monkeypatch):
    def failing(command, **kwargs):
        raise subprocess.CalledProcessError(9, command)

    monkeypatch.setattr(machine.shutil, "which", lambda name: "/usr/bin/" + name)
    assert measure.gpu_facts(run=failing) == {}


def test_versions_match_the_installed_distributions():
    found = measure.versions()
    for name in ("jax", "jaxlib", "optax"):
        assert found[name] == metadata.version(name)
