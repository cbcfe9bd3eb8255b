"""``fencelock._core`` is pure: no module under it may import I/O, clocks, randomness or threads.

Checked on the source with ``ast`` (so a lazy import inside a function is caught too) and on the
loaded modules' namespaces (so a name smuggled in some other way is caught as well).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import fencelock._core as core

FORBIDDEN = frozenset(
    {"socket", "redis", "asyncio", "threading", "time", "random", "select", "subprocess"}
)


def _module_names() -> list[str]:
    names = [core.__name__]
    for info in pkgutil.walk_packages(core.__path__, prefix=core.__name__ + "."):
        names.append(info.name)
    return sorted(names)


MODULES = _module_names()


def _imported_roots(tree: ast.AST, package: str) -> set[str]:
    """Top-level names of every module imported anywhere in ``tree`` (relative ones resolved)."""
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            roots.add(module.split(".")[0])
            # ``from fencelock import _sync``-style escapes out of the core are caught below
            for alias in node.names:
                roots.add(f"{module}.{alias.name}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("__import__", "import_module") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    roots.add(arg.value.split(".")[0])
                else:
                    roots.add("<dynamic import>")
    return roots


def test_core_has_modules() -> None:
    # the walk must find the real modules, or every other check here is vacuous
    assert {"fencing", "quorum", "timing", "backoff", "replies", "rounds", "keys"} <= {
        name.rsplit(".", 1)[-1] for name in MODULES
    }


@pytest.mark.parametrize("name", MODULES)
def test_source_imports_nothing_impure(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    source = Path(module.__file__).read_text(encoding="utf-8")
    package = name if module.__file__.endswith("__init__.py") else name.rsplit(".", 1)[0]
    roots = _imported_roots(ast.parse(source), package)
    bad = {r for r in roots if r.split(".")[0] in FORBIDDEN or r == "<dynamic import>"}
    assert not bad, f"{name} imports {sorted(bad)}"
    # imports from fencelock must stay inside fencelock._core, except the (pure) exception
    # hierarchy: flows raise the errors callers see, built from their tallies
    outside = {
        r
        for r in roots
        if r.startswith("fencelock")
        and not r.startswith(("fencelock._core", "fencelock.errors"))
        and "." in r
    }
    assert not outside, f"{name} imports outside the core: {sorted(outside)}"


@pytest.mark.parametrize("name", MODULES)
def test_loaded_namespace_has_no_impure_names(name: str) -> None:
    module = importlib.import_module(name)
    for attr, value in vars(module).items():
        if isinstance(value, types.ModuleType):
            assert value.__name__.split(".")[0] not in FORBIDDEN, f"{name}.{attr} is {value}"
            continue
        origin = getattr(value, "__module__", None)
        if isinstance(origin, str) and not attr.startswith("__"):
            assert origin.split(".")[0] not in FORBIDDEN, f"{name}.{attr} comes from {origin}"


def test_the_checker_catches_an_impure_import() -> None:
    tree = ast.parse(
        "import time\nfrom asyncio import sleep\ndef f():\n    import socket\n"
        "    __import__('random')\n"
    )
    roots = _imported_roots(tree, "fencelock._core")
    assert {"time", "asyncio", "socket", "random"} <= roots
