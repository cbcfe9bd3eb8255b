"""The CLI is a thin shell: it imports only public names of fencelock (no ``fencelock._*``)."""

from __future__ import annotations

import ast
from pathlib import Path

import fencelock.cli


def test_the_cli_imports_no_private_module() -> None:
    tree = ast.parse(Path(fencelock.cli.__file__).read_text())
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
