"""The house of docs/architecture.md: imports only run down the floors, and the wings stay apart.

Read from the source with ``ast`` (every import, at module level or inside a function), so an
import added anywhere that points up a floor, or from the library into a wing, fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fencelock

PACKAGE = Path(fencelock.__file__).parent

# floor of each first-level room of fencelock (higher may import lower, never the reverse);
# rooms on one floor may import each other only where listed in SAME_FLOOR
FLOORS: dict[str, int] = {
    "errors": 0,
    "_scripts": 0,
    "options": 1,
    "_core": 2,
    "_engine": 3,
    "_frontend": 4,
    "_sync": 5,
    "_async": 5,
    "fence": 6,
    "admin": 6,
    "election": 6,
    "client": 7,
    "compat": 7,
    "decorator": 8,
    "asyncio": 8,
    "__init__": 9,
    "integrations": 10,
    "testing": 10,
    "servers": 11,
    "cluster_servers": 11,
    "pytest_plugin": 11,
    "cli": 12,
    "__main__": 13,
}
# the two drivers share a floor: the asyncio one hands late release repeats and probes to the
# blocking driver's background thread (one per process); the blocking one never uses asyncio
SAME_FLOOR = {("_sync", "_async"): False, ("_async", "_sync"): True}


def _room(module: str) -> str:
    parts = module.split(".")
    assert parts[0] == "fencelock", module
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every ``fencelock`` import in ``path``."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1])  # the package a relative import starts from
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
                if node.module is None:  # from . import x: each name may be a module
                    for alias in node.names:
                        found.append((node.lineno, ".".join([*target, alias.name])))
                    continue
                found.append((node.lineno, ".".join(target)))
            elif node.module and node.module.split(".")[0] == "fencelock":
                if node.module == "fencelock":
                    for alias in node.names:
                        found.append((node.lineno, f"fencelock.{alias.name}"))
                else:
                    found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fencelock":
                    found.append((node.lineno, alias.name))
    return found


def _source_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_down_the_floors(path: Path) -> None:
    own = _room("fencelock." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    assert own in FLOORS, f"{path}: a room docs/architecture.md does not place"
    up = []
    for line, module in _imports(path):
        room = _room(module)
        if room == own:
            continue
        floor = FLOORS.get(room)
        if floor is None:
            floor = FLOORS["__init__"]  # a name of the public package itself
        if floor > FLOORS[own] or (floor == FLOORS[own] and not SAME_FLOOR.get((own, room), True)):
            up.append(f"line {line}: {module} (floor {floor} above {own}'s {FLOORS[own]})")
    assert up == []


def test_the_library_imports_neither_wing() -> None:
    """``import fencelock`` (and its asyncio front) loads no command and no test kit."""
    import subprocess
    import sys

    probe = (
        "import sys, fencelock, fencelock.asyncio, fencelock.fence, fencelock.admin;"
        "wings = (['fencelock', 'cli'], ['fencelock', 'testing']);"
        "bad = sorted(m for m in sys.modules if m.split('.')[:2] in wings);"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
