"""Deprecated name of :mod:`fencelock.testing` (the testing kit), kept for one release.

``from fencelock.servers import Server`` still works and warns (``DeprecationWarning``); write
``from fencelock.testing import Server``.
"""

from __future__ import annotations

import warnings

from .testing import *  # noqa: F403 - the whole kit, under its old name
from .testing import __all__ as _kit_names
from .testing.server import _embedded_binary  # noqa: F401 - a helper the old module had

__all__ = [*_kit_names]

warnings.warn(
    "fencelock.servers is deprecated; import from fencelock.testing instead",
    DeprecationWarning,
    stacklevel=2,
)
