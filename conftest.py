"""Root conftest: gives the Markdown doctests (README.md, docs/*.md) a real server.

Examples in the docs use ``SERVER_URL``; here it is a fresh embedded server per session.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fencelock.testing import Server


@pytest.fixture(scope="session")
def _docs_server() -> Iterator[Server]:
    server = Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _docs_namespace(
    request: pytest.FixtureRequest,
    doctest_namespace: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if type(request.node).__name__ == "DoctestItem":
        url = request.getfixturevalue("_docs_server").url
        doctest_namespace["SERVER_URL"] = url
        # the README's snippets define SERVER_URL themselves, from the variable the CLI reads
        monkeypatch.setenv("FENCELOCK_SERVERS", url)
