"""Measuring: honest timing, throughput, attention sweeps, the roofline, and machine facts."""

from jaxloops.measure.timing import CompileLog
from jaxloops.measure.timing import allocated_bytes
from jaxloops.measure.timing import compiled_flops
from jaxloops.measure.timing import compiled_temp_bytes
from jaxloops.measure.timing import count_compiles
from jaxloops.measure.timing import matmul_throughput
from jaxloops.measure.timing import time_call
from jaxloops.measure.timing import time_dispatch
from jaxloops.measure.throughput import compare_loops
from jaxloops.measure.throughput import random_batches
from jaxloops.measure.throughput import scan_throughput
from jaxloops.measure.sweeps import attention_sweep
from jaxloops.measure.sweeps import causal_sweep
from jaxloops.measure.sweeps import decode_sweep
from jaxloops.measure.sweeps import markdown_table
from jaxloops.measure.sweeps import numerics_table
from jaxloops.measure.sweeps import random_cache
from jaxloops.measure.sweeps import random_qkv
from jaxloops.measure.sweeps import read_bandwidth
from jaxloops.measure.sweeps import reference_attention
from jaxloops.measure.kernels import attention_fn
from jaxloops.measure.kernels import attention_with_fallback
from jaxloops.measure.kernels import implementation_report
from jaxloops.measure.kernels import run_attention
from jaxloops.measure.kernels import uses_cudnn_kernel
from jaxloops.measure.machine import describe_backend
from jaxloops.measure.roofline import Roofline
from jaxloops.measure.roofline import measure_roofline
from jaxloops.measure.roofline import roofline
from jaxloops.measure.machine import gpu_facts
from jaxloops.measure.machine import machine_facts
from jaxloops.measure.machine import run_label
from jaxloops.measure.machine import versions

__all__ = (
    "allocated_bytes",
    "attention_fn",
    "attention_sweep",
    "attention_with_fallback",
    "causal_sweep",
    "compare_loops",
    "compiled_flops",
    "compiled_temp_bytes",
    "CompileLog",
    "count_compiles",
    "decode_sweep",
    "describe_backend",
    "gpu_facts",
    "implementation_report",
    "machine_facts",
    "markdown_table",
    "measure_roofline",
    "matmul_throughput",
    "numerics_table",
    "random_batches",
    "random_cache",
    "random_qkv",
    "read_bandwidth",
    "reference_attention",
    "Roofline",
    "roofline",
    "run_attention",
    "run_label",
    "scan_throughput",
    "time_call",
    "time_dispatch",
    "uses_cudnn_kernel",
    "versions",
)
