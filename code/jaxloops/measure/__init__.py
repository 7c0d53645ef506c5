"""Measuring: honest timing, throughput, attention sweeps, the roofline, and machine facts."""

from jaxloops.measure.kernels import (
    attention_fn,
    attention_with_fallback,
    implementation_report,
    run_attention,
    uses_cudnn_kernel,
)
from jaxloops.measure.machine import describe_backend, gpu_facts, machine_facts, run_label, versions
from jaxloops.measure.profile import Span, busy_seconds, draw_timeline, trace_spans
from jaxloops.measure.roofline import Roofline, measure_roofline, roofline
from jaxloops.measure.sweeps import (
    attention_sweep,
    causal_sweep,
    compiled_costs,
    decode_sweep,
    markdown_table,
    naive_attention_parts,
    numerics_table,
    random_cache,
    random_qkv,
    read_bandwidth,
    reference_attention,
)
from jaxloops.measure.throughput import (
    fit_against_bare_epoch,
    host_pipeline,
    overlap_drivers,
    predicted_step_seconds,
    random_batches,
    scan_throughput,
)
from jaxloops.measure.timing import (
    CompileLog,
    allocated_bytes,
    compile_in_fresh_process,
    compiled_flops,
    compiled_temp_bytes,
    count_compiles,
    interleaved_seconds,
    matmul_throughput,
    time_call,
    time_dispatch,
)

from jaxloops.measure import gpu_report  # noqa: E402  (a module: measure.gpu_report.sidebar)

__all__ = (
    "allocated_bytes",
    "attention_fn",
    "attention_sweep",
    "attention_with_fallback",
    "causal_sweep",
    "busy_seconds",
    "compile_in_fresh_process",
    "compiled_costs",
    "compiled_flops",
    "compiled_temp_bytes",
    "CompileLog",
    "count_compiles",
    "decode_sweep",
    "describe_backend",
    "draw_timeline",
    "fit_against_bare_epoch",
    "gpu_facts",
    "host_pipeline",
    "implementation_report",
    "interleaved_seconds",
    "machine_facts",
    "markdown_table",
    "matmul_throughput",
    "measure_roofline",
    "naive_attention_parts",
    "numerics_table",
    "overlap_drivers",
    "predicted_step_seconds",
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
    "Span",
    "time_call",
    "time_dispatch",
    "trace_spans",
    "uses_cudnn_kernel",
    "versions",
)
