"""The CLI's argument layer is a thin shell: it imports only public names of fencelock (no
``fencelock._*``). The commands' machinery beside it (demo, bench, chaos, doctor, top) may use
the library's internals, as the tests do."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fencelock.cli

ARGUMENT_LAYER = ("__init__", "main", "common", "run", "elect", "status")


@pytest.mark.parametrize("module", ARGUMENT_LAYER)
def test_the_cli_imports_no_private_module(module: str) -> None:
    path = Path(fencelock.cli.__file__).parent / f"{module}.py"
    tree = ast.parse(path.read_text())
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = ("." * node.level) + (node.module or "")
            names = [alias.name for alias in node.names]
            parts = module.lstrip(".").split(".")
            if any(part.startswith("_") and part != "__future__" for part in parts if part):
                private.append(module)
            if module.lstrip(".") in ("", "fencelock"):
                private += [f"{module}{name}" for name in names if name.startswith("_")]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(part.startswith("_") for part in alias.name.split(".")[1:]):
                    private.append(alias.name)
    assert private == []


def test_a_run_starts_without_redis_py_the_asyncio_side_or_the_test_kit() -> None:
    """What ``fencelock run`` loads before its acquire (the command line parsed, the Lock built
    from a URL): not redis-py (whose import also loads its asyncio client and OpenTelemetry),
    valkey-py, the asyncio front end or the testing kit, which are most of its start-up time."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from fencelock.cli.main import parse_args\n"
        "from fencelock import Lock\n"
        "args = parse_args(['run', '--server', 'redis://127.0.0.1:1/0', '--key', 'k', '--', 'x'])\n"
        "Lock(args.servers, args.key).close()\n"
        "unwanted = ('redis', 'valkey', 'asyncio', 'fencelock._async', 'fencelock.asyncio',\n"
        "            'fencelock.testing', 'fencelock.cli.elect')\n"
        "print(sorted(m for m in sys.modules if m.startswith(unwanted)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
