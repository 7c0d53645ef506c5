"""What XLA says about a compiled program, read in one place.

Everything the book learns from a compiled program comes from here: its cost (FLOPs, bytes,
transcendentals) and scratch memory, its fusions, the copies its loop bodies make, its
collectives, and whether it calls a library kernel such as cuDNN's fused attention. Each reader
takes the compiled program, `jax.jit(f).lower(*args).compile()`, or, for the common case, the
function and its arguments (`compiled_costs(f, *args)`), which compiles once.

The compiled program, not the lowered one: it is what runs. Its FLOPs are the exception: they
come from the lowered program, because XLA:GPU's compiled cost analysis leaves out the matmuls
it hands to cuBLAS (jax-ml/jax#22249; on an H200 it gave chapter 6's MLP step at batch 32,768
11.1 GFLOP, where its matmuls alone do 217). On a CPU the two counts agree within 0.5 %. A
TPU's lowered program has no count at all (its cost analysis is empty): there the FLOPs come
from the compiled program, whose count includes the matmuls XLA:TPU compiles itself (a TPU
v5e counted an MLP train step whose matmuls do 35.5 MFLOP at 36.4). Loop bodies are counted
once by XLA's cost analysis, not once per trip.
"""

import math
import re
from collections.abc import Callable
from typing import Any

import jax

MiB = 2**20  # bytes in a mebibyte: every "MiB" the book prints divides by this one


def lower_call(fn: Callable[..., Any], *args) -> jax.stages.Lowered:
    """The lowered program of `jax.jit(fn)(*args)` (fn may already be jitted)."""
    return (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args)


def compile_call(fn: Callable[..., Any], *args) -> jax.stages.Compiled:
    """The compiled program of `jax.jit(fn)(*args)` (fn may already be jitted)."""
    return lower_call(fn, *args).compile()


def _cost(program) -> dict:
    try:
        cost = program.cost_analysis()
    except NotImplementedError:  # a backend whose lowered programs have no cost analysis
        return {}
    if isinstance(cost, (list, tuple)):  # older jax returned one dict per device
        cost = cost[0] if cost else None
    return cost or {}


def lowered_flops(
    lowered: jax.stages.Lowered, compiled: jax.stages.Compiled | None = None
) -> float:
    """FLOPs of a lowered program (what the maths does, on any backend: see the module's
    docstring for why not the compiled program's count); where the backend does not count
    lowered programs (a TPU), the compiled program's count: `compiled`'s if given, else
    `lowered` is compiled for it."""
    flops = float(_cost(lowered).get("flops", 0.0))
    if flops > 0:
        return flops
    return float(_cost(lowered.compile() if compiled is None else compiled).get("flops", 0.0))


def scratch_bytes(memory) -> int:
    """The scratch a compiled program allocates, from its `memory_analysis()`: its temp
    bytes, or where the backend reports none (a TPU's `temp_size_in_bytes` is 0 for every
    program), the live peak beyond its arguments and outputs (outputs that reuse a donated
    argument counted once). On a CPU the peak counts no temp, so the first is the larger;
    on a TPU v5e the second is the sum of the intermediates' tiled buffers (naive attention
    at T = 24: a (3, 24) sum, (3, 24, 24) bfloat16 weights and two copies, 45,056 bytes)."""
    if memory is None:
        return 0
    peak = int(getattr(memory, "peak_memory_in_bytes", 0) or 0)
    held = memory.argument_size_in_bytes + memory.output_size_in_bytes
    return int(max(memory.temp_size_in_bytes, peak - held + memory.alias_size_in_bytes, 0))


def costs_of(compiled: jax.stages.Compiled, lowered: jax.stages.Lowered | None = None) -> dict:
    """flops, bytes_accessed, transcendentals (cost analysis) and temp_bytes (memory
    analysis: the scratch the program allocates, `scratch_bytes`) of one compiled program; its
    flops from
    `lowered` where given, which a GPU needs (the module's docstring says why)."""
    cost = _cost(compiled)
    memory = compiled.memory_analysis()
    return {
        "flops": (
            lowered_flops(lowered, compiled) if lowered is not None else float(cost.get("flops", 0))
        ),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "transcendentals": float(cost.get("transcendentals", 0.0)),
        "temp_bytes": scratch_bytes(memory),
    }


def compiled_costs(fn: Callable[..., Any], *args) -> dict:
    """`costs_of` the compiled program of `jax.jit(fn)(*args)`, from a single compile (its
    flops from the lowered program)."""
    lowered = lower_call(fn, *args)
    return costs_of(lowered.compile(), lowered)


def compiled_flops(fn: Callable[..., Any], *args) -> float:
    """FLOPs of one call of `jax.jit(fn)(*args)`, from XLA's cost analysis of the lowered
    program (no compile)."""
    return lowered_flops(lower_call(fn, *args))


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?(\S+) = \S+ ([\w-]+)\(")
_COPY = re.compile(r"^\s*(?:ROOT )?%?\S+ = \w+\[([\d,]*)\]\S* copy\(")
# A layout after a shape: "{1,0}" on a CPU, "{1,0:T(8,128)S(1)}" on a TPU (its tiles and memory
# space), which a pattern must step over, not read as part of the shape.
LAYOUT = r"(?:\{[^}]*\})?"
# A tuple shape, whose layouts may hold parentheses of their own: "(f32[8]{0:T(256)}, s32[])",
# and which may hold a tuple: a TPU's slice-start returns "((f32[64,64]{1,0:T(8,128)}), ...)".
TUPLE = r"\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"
# A fusion's result may be a tuple (a TPU's fusions often return two arrays).
_FUSION = re.compile(
    rf"^\s*(?:ROOT )?%?(\S+) = ({TUPLE}|\S+) fusion\(.*kind=(\w+), calls=%?([\w.-]+)"
)
COLLECTIVE = re.compile(
    rf"= ({TUPLE}|\w+\[[\d,]*\][^ ]*) (all-reduce|all-gather|reduce-scatter|all-to-all|"
    r"collective-permute)(?:-start)?\("
)
SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_BOOKKEEPING = {"parameter", "constant", "bitcast", "broadcast", "tuple", "get-tuple-element"}


def program_text(program) -> str:
    return program if isinstance(program, str) else program.as_text()


def hlo_lines(text: str):
    """(computation, line) for each instruction line of compiled HLO text; the entry
    computation is named "ENTRY"."""
    computation = None
    for line in text.splitlines():
        if line and not line[0].isspace() and "{" in line:  # a computation begins
            computation = "ENTRY" if line.startswith("ENTRY") else line.split()[0].lstrip("%")
        elif computation is not None:
            yield computation, line


# An instruction's result is an array or a tuple (a TPU's fusions often write several arrays).
_ENTRY_INSTRUCTION = re.compile(rf"\s*(?:ROOT )?%?([\w.-]+) = ({TUPLE}|\S+?){LAYOUT} ([\w-]+)\(")


def plain_shape(shape: str) -> str:
    """A shape as HLO text writes it, without its layouts and comments: "f32[64,256]" for
    "f32[64,256]{1,0:T(8,128)}", "(f32[8], s32[])" for "(f32[8]{0:T(256)}, /*index=1*/s32[])"."""
    return re.sub(r"\{[^}]*\}|/\*[^*]*\*/", "", shape)


def entry_instructions(program) -> list[tuple[str, str, str]]:
    """The top-level instructions of a compiled program's (or its HLO text's) ENTRY
    computation: (name, opcode, output shape without its layouts), in program order.

    What runs as its own kernel: each `fusion` is one, and so is every instruction that XLA
    left outside a fusion (a `dot`, a `copy`). Parameters and tuples are bookkeeping. A
    result may be a tuple, "(f32[3,24], bf16[3,24,24])", as a TPU's fusions often are.
    """
    text = program_text(program)
    if "ENTRY" not in text:
        raise ValueError("no ENTRY computation in this text: pass compiled.as_text()")
    found = []
    for computation, line in hlo_lines(text):
        match = _ENTRY_INSTRUCTION.match(line) if computation == "ENTRY" else None
        if match:
            found.append((match.group(1), match.group(3), plain_shape(match.group(2))))
    return found


def loop_computations(text: str) -> set[str]:
    """Names of the computations a while loop runs on every trip (its body and condition)."""
    return set(re.findall(r"(?:body|condition)=%?([\w.-]+)", text))


def shape_dims(dims: str) -> tuple[int, ...]:
    return tuple(int(d) for d in dims.split(",") if d)


def fusions_of(program) -> list[dict]:
    """The fusions of a compiled program (or its HLO text).

    Returns:
      One row per fusion: name; kind (XLA's kLoop, kInput, kOutput, or kCustom for a library
      call such as a matmul); shape of its result (e.g. "f32[4,128,128]", without its layout)
      and its dims as a tuple, with elements their product (a tuple result, as a TPU's fusions
      often return: dims () and elements 0); where it runs ("once", or "loop" inside a while
      body; a fusion nested in another runs where that one runs); and the operations fused
      into it.
    """
    text = program_text(program)
    ops, fusions = {}, []
    for computation, line in hlo_lines(text):
        fusion = _FUSION.match(line)
        if fusion:
            fusions.append((computation, *fusion.groups()))
        instruction = _INSTRUCTION.match(line)
        if instruction:
            ops.setdefault(computation, []).append(instruction.group(2))
    loop_bodies = loop_computations(text)
    caller = {called: where for where, _, _, _, called in fusions}

    def runs(where: str) -> str:
        seen = set()  # a fusion nested in another (a TPU's) runs where its caller runs
        while where != "ENTRY" and where not in loop_bodies and where in caller:
            if where in seen:
                break
            seen.add(where)
            where = caller[where]
        return "once" if where == "ENTRY" else "loop" if where in loop_bodies else where

    rows = []
    for where, name, shape, kind, called in fusions:
        shape = plain_shape(shape)  # its layouts dropped (a tuple may have several)
        match = SHAPE.fullmatch(shape)
        dims = shape_dims(match.group(2)) if match else ()
        rows.append(
            {
                "fusion": name,
                "kind": kind,
                "shape": shape,
                "dims": dims,
                "elements": math.prod(dims) if match else 0,
                "runs": runs(where),
                "ops": ", ".join(sorted(set(ops.get(called, [])) - _BOOKKEEPING)),
            }
        )
    return rows


def compiled_fusions(fn: Callable[..., Any], *args) -> list[dict]:
    """`fusions_of` the compiled program of `jax.jit(fn)(*args)`."""
    return fusions_of(compile_call(fn, *args))


def loop_copies(program, elements: int) -> int:
    """`copy` instructions, inside the while-loop bodies of a compiled program (or its HLO
    text), whose result has `elements` elements: a loop that writes its carry in place copies
    none of it.

    Args:
      elements: the size of the carried array looked for (for a cache, B * K * S * H).
    """
    if elements < 1:
        raise ValueError(f"elements must be >= 1, got {elements}")
    text = program_text(program)
    in_loop = loop_computations(text)
    count = 0
    for computation, line in hlo_lines(text):
        copy = _COPY.match(line)
        if copy and computation in in_loop:
            count += math.prod(shape_dims(copy.group(1))) == elements
    return count


def dtype_bytes(dtype: str) -> int:
    if dtype == "pred":
        return 1
    return int(re.sub(r"\D", "", dtype) or 32) // 8


def collectives(program) -> dict[str, tuple[int, int]]:
    """Collectives of a compiled program (or its HLO text): kind -> (ops, bytes of their
    results on one device).

    A tuple-shaped op (several arrays combined into one all-reduce) counts once, with the
    bytes of all its arrays.
    """
    found: dict[str, tuple[int, int]] = {}
    for result, kind in COLLECTIVE.findall(program_text(program)):
        size = sum(
            math.prod(shape_dims(dims)) * dtype_bytes(dtype)
            for dtype, dims in SHAPE.findall(result)
        )
        ops, total = found.get(kind, (0, 0))
        found[kind] = (ops + 1, total + size)
    return found


def calls_target(program, target: str) -> bool:
    """True if a compiled program (or its HLO text) calls the custom-call `target`, e.g.
    cuDNN's fused attention, "__cudnn$fmha"."""
    return target in program_text(program)
