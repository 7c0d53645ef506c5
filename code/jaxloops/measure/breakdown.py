"""Where a compiled program's time goes: each kernel's traced time beside its roofline.

A kernel is an instruction of the compiled program's ENTRY computation (a fusion, a library
matmul, a copy): what runs as one unit. `kernels_of` reads, from the compiled HLO text, each
kernel's FLOPs (its dots: 2 x output elements x contracted length), its bytes (operands and
result, each once), the JAX operation it came from (`op_name`, with `transpose(` for the
backward pass) and the innermost Python function that wrote it (the stack frame tables).
`device_op_seconds` (profile.py) times each kernel from a profiler trace; `grouped` adds both
up by a caller's rule and predicts each group's time at the roofline.
"""

import dataclasses
import math
import re
from collections.abc import Callable

import jax
import numpy as np

from jaxloops.measure.compiled import LAYOUT, dtype_bytes, hlo_lines, program_text
from jaxloops.measure.profile import device_op_seconds, trace_spans

_NAMED = re.compile(r'^(\d+) "(.*)"$')
_LOCATION = re.compile(r"^(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)")
_FRAME = re.compile(r"^(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)")
_LINE = re.compile(rf"^\s*(?:ROOT )?%?([\w.-]+) = (\(.*?\)|\S+?){LAYOUT} ([\w-]+)\((.*?)\)")
_SHAPES = re.compile(r"(\w+)\[([\d,]*)\]")
_CALLS = re.compile(r"calls=%?([\w.-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_OPERAND = r"(?:\S+ )?%?([\w.-]+)"  # an operand, its shape printed before it or not
_DOT = re.compile(rf"= \S+?\[([\d,]*)\]\S* dot\({_OPERAND}, .*lhs_contracting_dims=\{{([\d,]*)\}}")
# A TPU's compiler writes a matmul as a convolution: "dim_labels=0bf_0io->0bf" names each dim
# of the input, the kernel and the output (b batch, f feature, i/o the kernel's in/out, digits
# spatial). Each output element sums the kernel's i inputs at each tap of its window that meets
# the input: not a tap over padding, nor over the holes of an input dilated by d (XLA:TPU folds
# a batch of matmuls into a spatial dim so: "window={size=3 stride=2 lhs_dilate=3}").
_CONVOLUTION = re.compile(
    rf"= \S+?\[([\d,]*)\]\S* convolution\({_OPERAND}, {_OPERAND}\)"
    r".*dim_labels=(\w+)_(\w+)->(\w+)"
)
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_PARAM = re.compile(r"^\s*(?:ROOT )?%?([\w.-]+) = (?:\w+\[([\d,]*)\])?")  # tuples: no dims


def _window(line: str, rank: int) -> dict[str, list]:
    """Per spatial dim: size, stride, pad (low), lhs_dilate, rhs_dilate of a convolution."""
    fields = dict(f.split("=") for f in m[1].split()) if (m := _WINDOW.search(line)) else {}

    def each(name, default):
        value = fields.get(name)
        return [default] * rank if value is None else value.split("x")

    pads = [int(p.split("_")[0]) for p in each("pad", "0_0")]
    ints = {n: [int(v) for v in each(n, "1")] for n in ("stride", "lhs_dilate", "rhs_dilate")}
    return {"pad": pads, **ints}


def _convolution_flops(output: list[int], lhs: list[int], kernel: list[int], labels, line):
    """2 x the multiply-adds of a convolution with these shapes and `labels` (input, kernel,
    output dim_labels), counting only the taps that meet the input."""
    lhs_labels, kernel_labels, out_labels = labels
    if not (len(lhs) == len(lhs_labels) and len(kernel) == len(kernel_labels)
            and len(output) == len(out_labels)):  # fmt: skip
        return 0.0
    digits = sorted(c for c in kernel_labels if c.isdigit())
    window = _window(line, len(digits))
    pairs = 1
    for d, c in enumerate(digits):
        size = kernel[kernel_labels.index(c)]
        n_in, n_out = lhs[lhs_labels.index(c)], output[out_labels.index(c)]
        dilate = window["lhs_dilate"][d]
        j, w = np.arange(n_out)[:, None], np.arange(size)[None, :]
        at = j * window["stride"][d] + w * window["rhs_dilate"][d] - window["pad"][d]
        pairs *= int(((at >= 0) & (at <= (n_in - 1) * dilate) & (at % dilate == 0)).sum())
    batch_features = math.prod(n for n, c in zip(output, out_labels) if not c.isdigit())
    return 2.0 * batch_features * kernel[kernel_labels.index("i")] * pairs


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str  # the ENTRY instruction, as the trace names it
    opcode: str  # fusion, dot, copy, ...
    op_name: str  # the JAX operation it came from, e.g. "jit(f)/transpose(jvp(...))/dot_general"
    stack: tuple[str, ...]  # the Python functions that wrote it, innermost first
    file: str  # the innermost function's file
    flops: float
    bytes: float

    @property
    def function(self) -> str:
        """The innermost Python function that wrote it ("" when not recorded)."""
        return self.stack[0] if self.stack else ""

    @property
    def backward(self) -> bool:
        """Part of a gradient: JAX names the VJP's operations transpose(jvp(...))."""
        return "transpose(" in self.op_name


def _tables(text: str) -> dict[int, tuple[tuple[str, ...], str]]:
    """stack_frame_id -> (functions innermost first, innermost file), from the tables XLA
    prints above the module (a frame's parent is printed one above its id; 0: none)."""
    files, functions, locations, frames, table = {}, {}, {}, {}, None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table = line
            continue
        if not line or line[0].isspace() or table is None:
            table = None if line.startswith(("ENTRY", "%", "HloModule")) else table
            continue
        if table in ("FileNames", "FunctionNames") and (m := _NAMED.match(line)):
            (files if table == "FileNames" else functions)[int(m[1])] = m[2]
        elif table == "FileLocations" and (m := _LOCATION.match(line)):
            locations[int(m[1])] = (functions.get(int(m[3]), ""), files.get(int(m[2]), ""))
        elif table == "StackFrames" and (m := _FRAME.match(line)):
            frames[int(m[1])] = (locations.get(int(m[2]), ("", "")), int(m[3]) - 1)
    stacks = {}
    for frame, ((function, file), parent) in frames.items():
        functions = [function]
        while parent in frames and len(functions) < 64:
            (caller, _), parent = frames[parent]
            functions.append(caller)
        stacks[frame] = (tuple(functions), file)
    return stacks


def _shape_bytes(shape: str) -> int:
    return sum(math.prod(int(d) for d in dims.split(",") if d) * dtype_bytes(dtype)
               for dtype, dims in _SHAPES.findall(shape))  # fmt: skip


def _dot_flops(text: str) -> dict[tuple[str, str], float]:
    """FLOPs of each instruction: its dot's 2 x output elements x contracted length, or the
    dots of the computations it calls (a fusion), keyed by (computation, instruction)."""
    shapes, own, calls = {}, {}, {}
    for computation, line in hlo_lines(text):
        if not (m := _PARAM.match(line)):
            continue
        name = m[1]
        shapes[(computation, name)] = [int(d) for d in (m[2] or "").split(",") if d]
        if dot := _DOT.search(line):
            lhs = shapes.get((computation, dot[2]), [])
            contracted = math.prod(lhs[int(i)] for i in dot[3].split(",") if i and lhs)
            own[(computation, name)] = 2.0 * math.prod(shapes[(computation, name)]) * contracted
        elif conv := _CONVOLUTION.search(line):
            lhs, kernel = (shapes.get((computation, o), []) for o in (conv[2], conv[3]))
            output = shapes[(computation, name)]
            flops = _convolution_flops(output, lhs, kernel, conv.groups()[3:], line)
            own[(computation, name)] = flops
        if called := _CALLS.search(line):
            calls[(computation, name)] = called[1]
    per_computation: dict[str, float] = {}
    for (computation, _), value in own.items():
        per_computation[computation] = per_computation.get(computation, 0.0) + value

    def total(computation: str, name: str) -> float:
        inner = calls.get((computation, name))
        nested = sum(total(inner, n) for c, n in calls if c == inner) if inner else 0.0
        return own.get((computation, name), 0.0) + per_computation.get(inner, 0.0) + nested

    return {key: total(*key) for key in shapes if key[0] == "ENTRY"}


def kernels_of(program) -> list[Kernel]:
    """The kernels of a compiled program (or its HLO text), in program order; parameters,
    tuples and other bookkeeping left out."""
    text = program_text(program)
    if "ENTRY" not in text:
        raise ValueError("no ENTRY computation in this text: pass compiled.as_text()")
    frames, flops = _tables(text), _dot_flops(text)
    shapes, kernels = {}, []
    for computation, line in hlo_lines(text):
        m = _LINE.match(line)
        if computation != "ENTRY" or not m:
            continue
        name, shape, opcode, operands = m.groups()
        shapes[name] = _shape_bytes(shape)
        if opcode in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
            continue
        own = flops.get(("ENTRY", name), 0.0)
        inputs = sum(shapes.get(o.strip().lstrip("%"), 0) for o in operands.split(","))
        op_name = _OP_NAME.search(line)
        frame = _FRAME_ID.search(line)
        stack, file = frames.get(int(frame[1]), ((), "")) if frame else ((), "")
        kernels.append(Kernel(name, opcode, op_name[1] if op_name else "", stack, file,
                              own, float(inputs + shapes[name])))  # fmt: skip
    return kernels


def instruction_name(event_name: str) -> str:
    """The HLO instruction a traced operation names: "fusion.12" from "fusion.12", or from the
    whole HLO line a TPU's trace names its "XLA Ops" events by, "%fusion.12 = bf16[8]{0}
    fusion(...)" (as xprof's readers of such traces split it; the chip's run of 2026-12-07
    matched no kernel of chapter 11's step without this)."""
    head = event_name.split(" = ", 1)[0].split()
    return head[0].lstrip("%") if head else event_name


def kernel_seconds(compiled, *args, tries: int = 3) -> dict[str, float]:
    """Seconds of each kernel in one call of `compiled(*args)`, by instruction name
    (`instruction_name`), from the shortest of `tries` profiler traces (`trace_spans`);
    after one untimed call. Kernels that run at the same time on different threads each
    count their own duration; loops and whole programs are left out, as
    `device_op_seconds` leaves them."""
    jax.block_until_ready(compiled(*args))
    seconds: dict[str, float] = {}
    traced = device_op_seconds(trace_spans(lambda: compiled(*args), tries=tries))
    for event, spent in traced.items():
        name = instruction_name(event)
        if not name.startswith(("while", "jit_")):
            seconds[name] = seconds.get(name, 0.0) + spent
    return seconds


def grouped(
    kernels: list[Kernel], seconds: dict[str, float], group: Callable[[Kernel], str], roof
) -> dict[str, dict]:
    """Kernels added up by `group(kernel)`: {group: {"seconds" (traced, per call), "flops",
    "bytes", "predicted" (the sum of each kernel's max(FLOPs / ceiling, bytes / bandwidth)),
    "kernels"}}, largest traced time first."""
    rows: dict[str, dict] = {}
    for kernel in kernels:
        row = rows.setdefault(group(kernel), dict(seconds=0.0, flops=0.0, bytes=0.0,
                                                  predicted=0.0, kernels=0))  # fmt: skip
        row["seconds"] += seconds.get(kernel.name, 0.0)
        row["flops"] += kernel.flops
        row["bytes"] += kernel.bytes
        row["predicted"] += roof.predict(kernel.flops, kernel.bytes)
        row["kernels"] += 1
    return dict(sorted(rows.items(), key=lambda item: -item[1]["seconds"]))


_MATMULS = {"project_qkv": "matmul: query, key, value", "attention_block": "matmul: attention out",
            "mlp_block": "matmul: MLP", "apply_blocks": "matmul: unembedding"}  # fmt: skip


def transformer_group(kernel: Kernel) -> str:
    """The group of a kernel of chapter 11's train step: matmuls by layer part, attention,
    norms, the MLP's GELU, embedding (forward and gradient), loss, optimizer, and copies and
    transposes (a kernel XLA named after a copy or a transpose it ends with, unless it does
    a layer part's matmul: XLA:TPU names a matmul whose result it adds into another
    `copy_add_fusion`). A custom call is never a copy by its name: XLA:TPU names a Pallas
    call after the JAX operation it came from, and the backward pass's are
    "transpose_jvp_..."."""
    attention = kernel.file.endswith(("attention.py", "blockwise.py"))
    part = next((f for f in kernel.stack if f in _MATMULS), None)
    if kernel.flops and part and not attention:
        return _MATMULS[part]
    named = kernel.opcode != "custom-call" and kernel.name.startswith(("copy", "transpose"))
    if kernel.opcode in ("copy", "transpose") or named:
        return "copies and transposes"
    if attention:
        return "attention"
    if "optax" in kernel.file or kernel.function.startswith("make_train_step"):
        return "optimizer"
    named = {"rms_norm": "norms", "embed": "embedding", "mlp_block": "MLP: GELU"}
    if kernel.function in named:
        return named[kernel.function]
    if kernel.file.endswith("losses.py"):
        return "loss"
    return "other"
