"""Build docs/api.md, the API reference, from the public modules' docstrings (offline).

    python tools/apidoc.py            # write docs/api.md
    python tools/apidoc.py --check    # exit 1 when docs/api.md is not what the code says

A module's public names are its ``__all__``; a class lists its public methods and properties
(those defined by fencelock itself, not inherited from the standard library). Signatures come
from :func:`inspect.signature` with the annotations as written in the source, so the page shows
what a type checker sees. Nothing here imports a network library's server or opens a socket.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "api.md"

# The modules a user imports, in the order the page lists them, each with one line on what
# it is for. An optional integration whose framework is not installed is listed as such.
MODULES: tuple[tuple[str, str], ...] = (
    ("fencelock", "the blocking front end: locks, the family, the client, errors"),
    ("fencelock.asyncio", "the asyncio front end: the same names, awaitable"),
    ("fencelock.election", "leader election whose term is the fence"),
    ("fencelock.fence", "storage guards that refuse stale writers"),
    ("fencelock.admin", "inspect and force-release locks (what `fencelock status` uses)"),
    ("fencelock.decorator", "`locked`: a function under a lock"),
    ("fencelock.compat", "drop-in shapes of redis-py's and python-redis-lock's locks"),
    ("fencelock.integrations.celery", "one running instance per Celery task and arguments"),
    ("fencelock.integrations.django", "Django settings client, `locked`, the ORM guard"),
    ("fencelock.integrations.otel", "OpenTelemetry metrics and spans"),
    ("fencelock.testing", "the testing kit: real servers, replicas, sentinels, clusters, faults"),
)


def _doc(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip()


def _signature(obj: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _own_members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public attributes defined by a fencelock class or a fencelock base of it."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("fencelock"):
            continue
        for name, member in vars(klass).items():
            if name in seen or (name.startswith("_") and name not in _DUNDERS):
                continue
            seen.add(name)
            yield name, member


# the special methods a user calls through syntax: worth a line each
_DUNDERS = frozenset({"__init__", "__enter__", "__exit__", "__aenter__", "__aexit__", "__call__"})


def _member(name: str, member: Any) -> list[str]:
    if isinstance(member, property):
        head, doc = f"- **`{name}`** (property)", _doc(member)
    elif isinstance(member, (staticmethod, classmethod)):
        func = member.__func__
        head, doc = f"- **`{name}{_signature(func)}`**", _doc(func)
    elif inspect.isfunction(member):
        head, doc = f"- **`{name}{_signature(member)}`**", _doc(member)
    else:
        return []
    lines = [head]
    if doc:
        lines += ["", *("  " + line if line else "" for line in doc.splitlines()), ""]
    return lines


def _entry(module: str, name: str, obj: Any) -> list[str]:
    lines: list[str] = []
    if inspect.isclass(obj):
        bases = [b.__name__ for b in obj.__bases__ if b is not object]
        kind = "exception" if issubclass(obj, BaseException) else "class"
        suffix = f"({', '.join(bases)})" if bases else ""
        lines += [f"### `{name}` — {kind} {suffix}".rstrip(), ""]
        if obj.__module__ != module:
            lines += [f"Defined in `{obj.__module__}`.", ""]
        if _doc(obj):
            lines += [_doc(obj), ""]
        for member_name, member in _own_members(obj):
            lines += _member(member_name, member)
        lines.append("")
    elif callable(obj):
        lines += [f"### `{name}{_signature(obj)}`", ""]
        if _doc(obj):
            lines += [_doc(obj), ""]
    else:
        lines += [f"### `{name}`", "", f"`{obj!r}`", ""]
    return lines


def render() -> str:
    """The whole page as text (deterministic for a given source tree)."""
    out = [
        "# API reference",
        "",
        "Generated from the docstrings by `python tools/apidoc.py` (a test checks it is up to",
        "date); edit the docstrings, not this page. The guides in `docs/` say how the pieces fit.",
        "",
    ]
    out += [f"- [`{name}`](#{name.replace('.', '')}): {what}" for name, what in MODULES]
    out.append("")
    for module_name, what in MODULES:
        out += [f"## {module_name}", "", f"*{what}*", ""]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            out += [f"(not importable here: {exc})", ""]
            continue
        if _doc(module):
            out += [_doc(module), ""]
        for name in sorted(getattr(module, "__all__", ())):
            out += _entry(module_name, name, getattr(module, name))
    text = "\n".join(out).rstrip() + "\n"
    # this machine's paths never reach the page (e.g. a default argument that is a path)
    return text.replace(str(ROOT), "<checkout>")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUT.exists() and OUT.read_text() == text:
            return 0
        print(f"{OUT} is stale: run python tools/apidoc.py", file=sys.stderr)
        return 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text.splitlines())} lines)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
