"""The per-thread / per-task stack behind ``with lock as lease`` (a context variable)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

# Tuples only, so a task that inherits its parent's context never pushes onto the parent's stack.
_held: ContextVar[tuple[tuple[int, Any], ...]] = ContextVar("fencelock_held", default=())


def push_held(owner: object, lease: object) -> None:
    _held.set((*_held.get(), (id(owner), lease)))


def pop_held(owner: object) -> Any:
    stack = _held.get()
    for pos in range(len(stack) - 1, -1, -1):
        if stack[pos][0] == id(owner):
            _held.set(stack[:pos] + stack[pos + 1 :])
            return stack[pos][1]
    raise RuntimeError("__exit__ without a matching __enter__ in this thread or task")


def innermost() -> Any:
    """The lease pushed last in this thread or task, or None."""
    stack = _held.get()
    return stack[-1][1] if stack else None
