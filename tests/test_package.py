"""The package's public face: narrow, with its secondary namespaces, and one import style."""

import ast
import importlib.util
import inspect
import pathlib
import re

import jaxloops
from jaxloops import measure, solutions

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "code" / "jaxloops"


def test_the_top_level_exports_the_core_only():
    assert len(jaxloops.__all__) <= 62
    assert len(set(jaxloops.__all__)) == len(jaxloops.__all__)
    for name in jaxloops.__all__:
        assert hasattr(jaxloops, name), name
    # Measurement helpers and exercise answers live in their own namespaces.
    for name in ("time_call", "roofline", "random_qkv", "gpu_facts", "attention_sweep"):
        assert name not in jaxloops.__all__ and name in measure.__all__
    for name in ("adamw_update", "max_kv_heads", "top_k_accuracy"):
        assert name not in jaxloops.__all__ and name in solutions.__all__


def test_every_namespace_exports_what_it_names():
    for namespace in (measure, solutions):
        assert sorted(namespace.__all__, key=str.lower) == list(namespace.__all__)
        for name in namespace.__all__:
            assert hasattr(namespace, name), f"{namespace.__name__}.{name}"


def test_no_module_imports_a_private_name_of_another():
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxloops"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.relative_to(ROOT)} imports {private} from {node.module}"


def page_import_problems(chapter: str, text: str) -> list[str]:
    """The import lines of chapter `chapter` (its file name's stem) that break the style:
    `import jaxloops` and `from jaxloops import <module>` for the lesson, `from
    jaxloops.measure import <module>` for an instrument, `from jaxloops.pages import check,
    glue_all`, the modules every page shares (`goals`, the goals the issues set; `render`, the
    tables and drawings; `gpu_appendix`, the recorded GPU run the sidebars quote), and `from
    jaxloops.pages import <this chapter's page module> as page`; never `from jaxloops.x
    import name`, and never another chapter's page module."""
    allowed = re.compile(
        r"^(import jaxloops|from jaxloops(\.measure)? import [a-z_]+(, [a-z_]+)*"
        r"|from jaxloops\.pages import (check|glue_all|goals|render|gpu_appendix)(, glue_all)?"
        r"|from jaxloops\.pages import (\w+) as page)$"
    )
    problems = []
    for line in text.splitlines():
        stripped = line.split("#")[0].strip()
        if not re.match(r"^(from|import) jaxloops\b", stripped):
            continue
        match = allowed.match(stripped)
        if not match or match.group(6) not in (None, f"ch{chapter}", chapter):
            problems.append(stripped)
            continue
        module = stripped.split(" import ")[0].removeprefix("from ")
        for name in stripped.split(" import ")[-1].split(", ") if match.group(2) is None else ():
            if stripped.startswith("from jaxloops import") or stripped.startswith(
                "from jaxloops.measure import"
            ):
                # A submodule, not a function of the same name, whatever was imported before.
                attribute = getattr(importlib.import_module(module), name, None)
                if not (attribute is None or inspect.ismodule(attribute)):
                    problems.append(stripped)
                elif not importlib.util.find_spec(f"{module}.{name}"):
                    problems.append(stripped)
    return problems


def test_chapters_use_one_import_style():
    """The lesson is `jaxloops.`, the instruments `measure.`, this page's bookkeeping `page.`:
    names stay qualified (`measure.time_call`, `page.decode_table`)."""
    for path in sorted((ROOT / "book").glob("*.md")):
        assert page_import_problems(path.stem, path.read_text()) == [], path.name
    # A name imported from a module, and another chapter's page module, are refused.
    good = "from jaxloops import measure\nfrom jaxloops.pages import ch10_heads_and_cache as page"
    assert page_import_problems("10_heads_and_cache", good) == []
    assert page_import_problems("10_heads_and_cache", "from jaxloops.attention import attention")
    assert page_import_problems("09_causal", good) == [good.splitlines()[1]]
    assert page_import_problems("01_watching_jax", "from jaxloops import fit") == [
        "from jaxloops import fit"
    ]
