"""The pytest plugin's old module path; the plugin is :mod:`fencelock.testing.pytest_plugin`
(an installed package's ``fencelock`` entry point names that; this stays for installs made before
it moved)."""

from __future__ import annotations

from .testing.pytest_plugin import *  # noqa: F403
