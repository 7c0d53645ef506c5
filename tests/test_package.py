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


def test_chapters_use_one_import_style():
    """`import jaxloops` and `from jaxloops import <module>`: names stay qualified
    (`measure.time_call`, `sharding.data_mesh`); never `from jaxloops.x import name`."""
    allowed = re.compile(r"^(import jaxloops|from jaxloops import [a-z_]+(, [a-z_]+)*)$")
    for path in sorted((ROOT / "book").glob("*.md")):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if re.match(r"^(from|import) jaxloops\b", stripped):
                assert allowed.match(stripped), f"{path.name}: {stripped}"
                for name in stripped.removeprefix("from jaxloops import ").split(", "):
                    if stripped.startswith("from"):
                        # A submodule, not a top-level function of the same name, whatever
                        # the tests imported before this one.
                        attribute = getattr(jaxloops, name, None)
                        assert attribute is None or inspect.ismodule(attribute), name
                        assert importlib.util.find_spec(f"jaxloops.{name}"), f"{path.name}: {name}"
