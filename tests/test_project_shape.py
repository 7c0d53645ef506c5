"""The project's shape, held: functions of at most 60 lines, chapters that show most of the
code they run, and a package whose imports form layers (issue 22's limits). Each check is
also fed a case it must reject."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
CODE = ROOT / "code"
MAX_FUNCTION_LINES = 60
MAX_HIDDEN_SHARE = 0.35
# The modules built on the measuring half: chapter 11's step timing and chapter 15's feeds
# time what they teach. No other concept module imports `jaxloops.measure`.
MEASURING_CONCEPTS = {"jaxloops.step_speed", "jaxloops.streaming"}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'name (n lines)' for each function (or method) of `source` longer than `limit` lines,
    counted from its `def` to its last line."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > limit
    ]


CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)


def hidden_share(chapter: str) -> tuple[int, int]:
    """(lines in cells removed from the page, lines in all code cells): a line is one that
    runs, not blank, not a comment, not a cell option; a cell is removed by `remove-cell` or
    `remove-input`."""
    hidden = total = 0
    for cell in CELL.finditer(chapter):
        body = cell.group(1)
        removed = re.search(r"^:tags:.*remove-(cell|input)", body, re.M) is not None
        lines = [
            line for line in body.splitlines()
            if line.strip() and not line.strip().startswith(("#", ":", "---"))
        ]  # fmt: skip
        total += len(lines)
        hidden += len(lines) if removed else 0
    return hidden, total


def module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(CODE).with_suffix("").parts).removesuffix(".__init__")


def package_imports() -> dict[str, set[str]]:
    """{module: the package's modules it imports}, at any depth of the file (an import inside
    a function is still an arrow)."""
    paths = {module_name(p): p for p in CODE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from pkg import module` imports the module (its package is imported by
                # any of its modules); `from pkg import name` imports the package.
                named = {f"{node.module}.{a.name}" for a in node.names}
                targets |= (named & paths.keys()) | (
                    {node.module} if named - paths.keys() else set()
                )
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected parts of more than one module."""
    order, low, stack, found = {}, {}, [], []

    def visit(v):
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            part = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return found


def test_no_function_in_the_package_or_scripts_is_over_60_lines():
    too_long = {
        str(path.relative_to(ROOT)): long_functions(path.read_text())
        for path in [*CODE.rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    }
    assert not {path: names for path, names in too_long.items() if names}
    # A 61-line function is refused, a 60-line one is not.
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert long_functions(f"def f():\n{body}") == []
    assert long_functions(f"def f():\n{body}    return x0\n") == ["f (61 lines)"]


def test_no_chapter_hides_more_than_35_percent_of_the_lines_it_runs():
    shares = {}
    for path in sorted((ROOT / "book").glob("[0-9]*.md")):
        hidden, total = hidden_share(path.read_text())
        shares[path.name] = hidden / total
    assert len(shares) >= 16
    assert max(shares.values()) <= MAX_HIDDEN_SHARE, shares
    # A cell removed from the page counts; a comment or a cell option does not.
    shown = "```{code-cell} python\nx = 1\ny = 2\n# why\n```\n"
    removed = "```{code-cell} python\n:tags: [remove-cell]\nglue('x', x)\n```\n"
    assert hidden_share(shown + removed) == (1, 3)
    assert hidden_share(shown + removed + removed) == (2, 4)  # 50 %: refused


def test_the_package_imports_form_layers():
    graph = package_imports()
    assert "jaxloops.measure.roofline" in graph["jaxloops.step_speed"]  # arrows are read
    assert cycles(graph) == []
    on_measure = {
        name for name, targets in graph.items()
        if not name.startswith(("jaxloops.measure", "jaxloops.workers", "jaxloops.solutions"))
        and name != "jaxloops" and any(t.startswith("jaxloops.measure") for t in targets)
    }  # fmt: skip
    assert on_measure == MEASURING_CONCEPTS
    # A cycle through three modules is found; a chain is not a cycle.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
