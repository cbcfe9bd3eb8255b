"""``$FENCELOCK_SERVERS`` takes what ``--server`` takes: plain, Cluster and Sentinel URLs."""

from __future__ import annotations

import pytest

from fencelock import ConfigError
from fencelock.cli.common import ENV_SERVERS, resolve_servers


def test_the_variable_takes_cluster_and_sentinel_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    urls = "redis://127.0.0.1:7000/0,redis+cluster://127.0.0.1:7001,redis+sentinel://127.0.0.1:26379/mymaster"
    monkeypatch.setenv(ENV_SERVERS, urls)
    assert resolve_servers([], ["redis://127.0.0.1:6379/0"]) == urls.split(",")


def test_a_malformed_url_in_the_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SERVERS, "redis+sentinel://127.0.0.1:26379")  # no service name
    with pytest.raises(ConfigError, match=ENV_SERVERS):
        resolve_servers([], [])
