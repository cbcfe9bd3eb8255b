"""Deprecated name of :mod:`fencelock.testing.cluster`, kept for one release (it warns)."""

from __future__ import annotations

import warnings

from .testing.cluster import SLOTS, Cluster, ClusterNode

__all__ = ["SLOTS", "Cluster", "ClusterNode"]

warnings.warn(
    "fencelock.cluster_servers is deprecated; import from fencelock.testing instead",
    DeprecationWarning,
    stacklevel=2,
)
