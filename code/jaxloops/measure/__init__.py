"""Measuring: honest timing, throughput, attention sweeps, the roofline, and machine facts."""

from jaxloops.measure import attention_figures as attention_figures  # ch08-09: causal_goal
from jaxloops.measure import attention_plots as attention_plots  # ch10: kv_grouping
from jaxloops.measure import comms as comms  # a module: measure.comms.per_step
from jaxloops.measure import compiled as compiled  # a module: measure.compiled.fusions_of
from jaxloops.measure import decode_figures as decode_figures  # ch10: layout_figures
from jaxloops.measure import gpu_report as gpu_report  # a module: measure.gpu_report.sidebar
from jaxloops.measure import kernel_figures as kernel_figures  # ch08: tile_passes
from jaxloops.measure import lm_figures as lm_figures  # ch11: training_figures
from jaxloops.measure import lm_plots as lm_plots  # ch11: training_curves
from jaxloops.measure import memory as memory  # a module: measure.memory.formula_sweep
from jaxloops.measure import memory_plots as memory_plots  # measure.memory_plots.loss_curves
from jaxloops.measure import published as published  # a module: measure.published.PUBLISHED
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
    blocked_share,
    busy_seconds,
    device_op_seconds,
    device_under_host_work,
    draw_timeline,
    overlap_seconds,
    predicted_blocked_shares,
    trace_spans,
    wait_count,
)
from jaxloops.measure.render import (
    draw_params,
    draw_scan,
    draw_throughput,
    draw_tree,
    markdown_table,
)
from jaxloops.measure.roofline import (
    CEILING_MARGIN,
    Roofline,
    ceiling_rates,
    ceiling_runs,
    last_level_cache_bytes,
    measure_roofline,
    raise_roofline,
    roofline,
    samples_beside_ceiling,
)
from jaxloops.measure.sweeps import (
    attention_sweep,
    blockwise_tile_parts,
    causal_sweep,
    decode_layout_control,
    decode_sweep,
    naive_attention_parts,
    numerics_table,
    random_cache,
    random_qkv,
    reference_attention,
    softmax_without_exp,
)
from jaxloops.measure.throughput import (
    core_shares,
    fit_against_bare_epoch,
    free_cores,
    host_pipeline,
    interleaved_with_core_shares,
    offered_cores,
    overlap_drivers,
    paired_ratio,
    predicted_step_seconds,
    random_batches,
    scan_throughput,
    scan_throughputs,
    spin_iterations,
    turns_verdict,
)
from jaxloops.measure.timing import (
    CompileLog,
    allocated_bytes,
    compile_in_fresh_process,
    count_compiles,
    interleaved_samples,
    interleaved_seconds,
    suite_cache_report,
    time_call,
    time_dispatch,
)

__all__ = (
    "allocated_bytes",
    "attention_fn",
    "attention_sweep",
    "attention_with_fallback",
    "blocked_share",
    "blockwise_tile_parts",
    "busy_seconds",
    "causal_sweep",
    "CEILING_MARGIN",
    "ceiling_rates",
    "ceiling_runs",
    "check",
    "collectives",
    "compile_in_fresh_process",
    "compiled_costs",
    "compiled_flops",
    "compiled_fusions",
    "CompileLog",
    "core_shares",
    "count_compiles",
    "decode_layout_control",
    "decode_sweep",
    "describe_backend",
    "device_op_seconds",
    "device_under_host_work",
    "draw_params",
    "draw_scan",
    "draw_throughput",
    "draw_timeline",
    "draw_tree",
    "fit_against_bare_epoch",
    "free_cores",
    "gpu_facts",
    "host_pipeline",
    "implementation_report",
    "interleaved_samples",
    "interleaved_seconds",
    "interleaved_with_core_shares",
    "last_level_cache_bytes",
    "loop_copies",
    "machine_facts",
    "markdown_table",
    "measure_roofline",
    "naive_attention_parts",
    "numerics_table",
    "offered_cores",
    "overlap_drivers",
    "overlap_seconds",
    "PageCheckWarning",
    "paired_ratio",
    "predicted_blocked_shares",
    "predicted_step_seconds",
    "raise_roofline",
    "random_batches",
    "random_cache",
    "random_qkv",
    "reference_attention",
    "roofline",
    "Roofline",
    "run_attention",
    "run_label",
    "samples_beside_ceiling",
    "scan_throughput",
    "scan_throughputs",
    "softmax_without_exp",
    "Span",
    "spin_iterations",
    "strict",
    "suite_cache_report",
    "time_call",
    "time_dispatch",
    "trace_spans",
    "turns_verdict",
    "uses_cudnn_kernel",
    "versions",
    "wait_count",
)
