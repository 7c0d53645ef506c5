"""The project's shape, held: functions of at most 60 lines, chapters whose hidden cells
define nothing, and a package whose imports form layers, module by module and folder by
folder (issues 22 and 45). Each check is also fed a case it must reject."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
CODE = ROOT / "code"
MAX_FUNCTION_LINES = 60
# The folders of the package; any other module is a concept (the package's own `__init__`
# among them). A concept imports neither `measure` nor `pages`.
FOLDERS = ("measure", "pages", "workers", "solutions")


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
HIDING = re.compile(r"^:tags:.*\b(remove-cell|remove-input|hide-input)\b", re.M)


def hidden_definitions(chapter: str) -> list[str]:
    """'line n: name' for each function or class a hidden cell of `chapter` defines (a cell
    tagged `remove-cell`, `remove-input` or `hide-input`): a `def`, a `class`, or a name bound
    to a `lambda`. A hidden cell only calls, glues and asserts; logic lives in `pages/`."""
    found = []
    for cell in CELL.finditer(chapter):
        body = cell.group(1)
        if not HIDING.search(body):
            continue
        first = chapter[: cell.start(1)].count("\n") + 1
        code = "\n".join(
            "" if line.startswith((":", "%", "!")) else line  # options blanked: lines hold
            for line in body.splitlines()
        )
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.append(f"line {first + node.lineno - 1}: {node.name}")
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
                names = ", ".join(ast.unparse(target) for target in node.targets)
                found.append(f"line {first + node.lineno - 1}: {names}")
    return found


def folder_of(module: str) -> str:
    """The folder a module of the package lives in: one of FOLDERS, or "concepts"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else "concepts"


def folder_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """{folder: the other folders its modules import}, from a module graph."""
    folders = {}
    for name, targets in graph.items():
        here = folder_of(name)
        folders.setdefault(here, set()).update(folder_of(t) for t in targets)
        folders[here].discard(here)
    return folders


def module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(CODE).with_suffix("").parts).removesuffix(".__init__")


def imports_of(source: str, modules) -> set[str]:
    """The names among `modules` that `source` imports, at any depth of the file (an import
    inside a function is still an arrow)."""
    targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import module` imports the module (its package is imported by any of
            # its modules); `from pkg import name` imports the package.
            named = {f"{node.module}.{a.name}" for a in node.names}
            targets |= (named & modules) | ({node.module} if named - modules else set())
    return targets & modules


def package_imports() -> dict[str, set[str]]:
    """{module: the package's modules it imports}, imports inside functions included."""
    paths = {module_name(p): p for p in CODE.rglob("*.py")}
    return {
        name: imports_of(path.read_text(), paths.keys()) - {name} for name, path in paths.items()
    }


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


def test_no_hidden_cell_defines_a_function():
    chapters = sorted((ROOT / "book").glob("[0-9]*.md"))
    assert len(chapters) >= 16
    defined = {path.name: hidden_definitions(path.read_text()) for path in chapters}
    assert {name: found for name, found in defined.items() if found} == {}
    # A def, a class or a named lambda in a hidden cell is found; the same in a shown cell,
    # and a lambda passed as an argument in a hidden one, are not.
    shown = "```{code-cell} python\ndef f():\n    return 1\n```\n"
    hidden = (
        "```{code-cell} python\n:tags: [remove-input]\nkeep = sorted(r, key=lambda r: r[0])\n```\n"
    )
    assert hidden_definitions(shown + hidden) == []
    for tag in ("remove-cell", "remove-input", "hide-input"):
        bad = f"```{{code-cell}} python\n:tags: [{tag}]\nx = 1\ndef f():\n    return x\n```\n"
        assert hidden_definitions(shown + bad) == ["line 8: f"], tag
    named = (
        "```{code-cell} python\n:tags: [remove-cell]\nglue_all = lambda **v: v\nclass C: ...\n```\n"
    )
    assert hidden_definitions(named) == ["line 3: glue_all", "line 4: C"]


def test_the_package_imports_form_layers():
    graph = package_imports()
    assert "jaxloops.measure.roofline" in graph["jaxloops.measure.step_speed"]  # arrows are read
    assert cycles(graph) == []
    # A cycle through three modules is found; a chain is not a cycle.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def concepts_on_the_book(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """{concept module: the `measure` and `pages` modules it imports}, for each that does."""
    found = {
        name: sorted(t for t in targets if folder_of(t) in ("measure", "pages"))
        for name, targets in graph.items()
        if folder_of(name) == "concepts"
    }
    return {name: targets for name, targets in found.items() if targets}


def test_no_concept_module_imports_measure_or_pages():
    assert concepts_on_the_book(package_imports()) == {}
    # An import inside a function is an arrow too; a concept importing `measure` there, or the
    # package importing `pages`, is refused; a page module importing a concept is not.
    inside = "def f():\n    from jaxloops.measure import timing\n    return timing\n"
    assert imports_of(inside, {"jaxloops.measure.timing"}) == {"jaxloops.measure.timing"}
    made = {
        "jaxloops.loop": {"jaxloops.measure.timing"},
        "jaxloops": {"jaxloops.pages"},
        "jaxloops.pages.ch09_causal": {"jaxloops.loop", "jaxloops.measure"},
    }
    assert concepts_on_the_book(made) == {
        "jaxloops.loop": ["jaxloops.measure.timing"],
        "jaxloops": ["jaxloops.pages"],
    }


def test_the_folders_import_each_other_without_a_cycle():
    folders = folder_imports(package_imports())
    assert set(folders) == {"concepts", *FOLDERS}
    assert cycles(folders) == []
    assert not folders["concepts"] & {"measure", "pages", "workers", "solutions"}
    assert "pages" not in folders["measure"] | folders["workers"]
    # Workers started by a concept that imports `workers` (inside a function) while the workers
    # import that concept: a cycle between folders that no two modules show alone.
    graph = {
        "jaxloops.sharding": {"jaxloops.workers"},
        "jaxloops.workers": {"jaxloops.sizes"},
        "jaxloops.workers.sharding": {"jaxloops.sharding"},
        "jaxloops.sizes": set(),
    }
    assert cycles(graph) == []
    assert cycles(folder_imports(graph)) == [["concepts", "workers"]]
