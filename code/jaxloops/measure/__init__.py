"""Measuring: honest timing, throughput, attention sweeps, the roofline, and machine facts."""

from jaxloops.measure import gpu_report as gpu_report  # a module: measure.gpu_report.sidebar
from jaxloops.measure import memory as memory  # a module: measure.memory.formula_sweep
from jaxloops.measure.check import PageCheckWarning, check, strict
from jaxloops.measure.compiled import (
    collectives,
    compiled_costs,
    compiled_flops,
    compiled_fusions,
    loop_copies,
)
from jaxloops.measure.kernels import (
    attention_fn,
    attention_with_fallback,
    implementation_report,
    run_attention,
    uses_cudnn_kernel,
)
from jaxloops.measure.machine import describe_backend, gpu_facts, machine_facts, run_label, versions
from jaxloops.measure.profile import (
    Span,
    busy_seconds,
    device_op_seconds,
    draw_timeline,
    overlap_seconds,
    trace_spans,
)
from jaxloops.measure.roofline import Roofline, measure_roofline, roofline
from jaxloops.measure.sweeps import (
    attention_sweep,
    blockwise_tile_parts,
    causal_sweep,
    decode_sweep,
    markdown_table,
    naive_attention_parts,
    numerics_table,
    random_cache,
    random_qkv,
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
    count_compiles,
    interleaved_samples,
    interleaved_seconds,
    time_call,
    time_dispatch,
)

__all__ = (
    "allocated_bytes",
    "attention_fn",
    "attention_sweep",
    "attention_with_fallback",
    "blockwise_tile_parts",
    "busy_seconds",
    "causal_sweep",
    "check",
    "collectives",
    "compile_in_fresh_process",
    "compiled_costs",
    "compiled_flops",
    "compiled_fusions",
    "CompileLog",
    "count_compiles",
    "decode_sweep",
    "describe_backend",
    "device_op_seconds",
    "draw_timeline",
    "fit_against_bare_epoch",
    "gpu_facts",
    "host_pipeline",
    "implementation_report",
    "interleaved_samples",
    "interleaved_seconds",
    "loop_copies",
    "machine_facts",
    "markdown_table",
    "measure_roofline",
    "naive_attention_parts",
    "numerics_table",
    "overlap_drivers",
    "overlap_seconds",
    "PageCheckWarning",
    "predicted_step_seconds",
    "random_batches",
    "random_cache",
    "random_qkv",
    "reference_attention",
    "Roofline",
    "roofline",
    "run_attention",
    "run_label",
    "scan_throughput",
    "Span",
    "strict",
    "time_call",
    "time_dispatch",
    "trace_spans",
    "uses_cudnn_kernel",
    "versions",
)
