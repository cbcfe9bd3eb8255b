"""What every started thing of the kit shares: ``with thing:`` starts it and stops it again."""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["Managed"]

_M = TypeVar("_M", bound="Managed")


class Managed:
    """``with thing as t:`` starts ``thing`` unless :meth:`_started` says it already runs, and
    calls :meth:`stop` on the way out, whatever ended the block: no process outlives it."""

    def start(self, timeout: float = 10.0) -> Any:
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> None:
        raise NotImplementedError

    def _started(self) -> bool:
        """True when entering must not start it again (default: every entry starts)."""
        return False

    def __enter__(self: _M) -> _M:
        if not self._started():
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
