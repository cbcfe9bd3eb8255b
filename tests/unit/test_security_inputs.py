"""Pure checks of issue 23 #4's smaller holes (no servers): URL redaction and refusal, key
encoding, TLS settings that turn authentication off, terminal escaping, the bounded holder
parse, and the process-group reaping that must not outlive the group."""

from __future__ import annotations

import signal
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

import fencelock
import fencelock.cli.common as cli_common
import fencelock.cli.run as cli_run
from fencelock._core.holder_json import MAX_HOLDER_DEPTH, parse_holder
from fencelock._engine.address import InsecureTLSWarning, from_url, sentinels_from_url
from fencelock.options import check_url, redact_url


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:1/0?password=s3cret",
        "redis://h:1/0?db=1&password=s3cret",
        "rediss://u:s3cret@h:1/0?password=s3cret&ssl_cert_reqs=required",
    ],
)
def test_a_password_in_the_netloc_or_the_query_is_redacted(url: str) -> None:
    shown = redact_url(url)
    assert "s3cret" not in shown and "***" in shown
    with pytest.raises(fencelock.ConfigError) as info:  # unknown option 'password'
        from_url(url)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis+sentinel://:s3cret@h1:1,h2:2/svc", "redis+sentinel://:***@h1:1,h2:2/svc"),
        ("redis+sentinel://app:s3cret@h1,h2/svc", "redis+sentinel://app:***@h1,h2/svc"),
        ("redis+cluster://:s3cret@h:1", "redis+cluster://:***@h:1"),
        ("redis://:s3cret@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
    ],
)
def test_a_password_before_several_hosts_is_redacted_and_the_hosts_kept(
    url: str, shown: str
) -> None:
    assert redact_url(url) == shown


def test_a_url_without_a_secret_is_shown_unchanged() -> None:
    assert redact_url("redis://h:1/0?db=1") == "redis://h:1/0?db=1"


@pytest.mark.parametrize("url", ["redis://app@h:1/0", "rediss://app@h/0", "valkey://%41pp@h"])
def test_a_user_name_without_a_password_is_refused(url: str) -> None:
    with pytest.raises(fencelock.ConfigError, match="no password"):
        check_url(url)
    with pytest.raises(fencelock.ConfigError, match="no password"):
        fencelock.Lock(url, "k")  # at construction, before any I/O


def test_an_empty_password_is_still_a_password() -> None:
    assert from_url("redis://app:@h:1/0").password == ""


def test_a_key_that_cannot_be_encoded_is_refused_at_construction() -> None:
    with pytest.raises(fencelock.ConfigError, match="UTF-8"):
        fencelock.Lock("redis://127.0.0.1:1/0", "orders:\ud800")
    with pytest.raises(fencelock.ConfigError, match="UTF-8"):
        fencelock.Client("redis://127.0.0.1:1/0").lock("\udcff")


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("ssl_cert_reqs=none", "ssl_cert_reqs=none"),
        ("ssl_cert_reqs=optional", "ssl_cert_reqs=optional"),
        ("ssl_check_hostname=false", "ssl_check_hostname=false"),
    ],
)
def test_tls_that_does_not_authenticate_the_server_warns(query: str, said: str) -> None:
    with pytest.warns(InsecureTLSWarning, match=said):
        from_url(f"rediss://u:s3cret@h:1/0?{query}")


def test_verified_tls_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", InsecureTLSWarning)
        assert from_url("rediss://h:1/0").tls is not None


def test_shown_escapes_what_a_terminal_would_obey() -> None:
    assert cli_common.shown("host-1") == "host-1"
    assert cli_common.shown("a\x1b[2J\nb\u202ec\x9b\U000e0001") == (
        "a\\x1b[2J\\x0ab\\u202ec\\x9b\\U000e0001"
    )
    assert cli_common.shown(1234) == "1234"


def test_holder_info_is_parsed_within_bounds() -> None:
    assert parse_holder('{"host": "h", "pid": 1}') == {"host": "h", "pid": 1}
    assert parse_holder('{"s": "[[[[[[[[[[[[[[[[[[[[[[[[[[[["}') == {"s": "[" * 28}
    nested = "[" * (MAX_HOLDER_DEPTH + 1) + "]" * (MAX_HOLDER_DEPTH + 1)
    assert parse_holder('{"a": ' + nested + "}") is None
    assert parse_holder("[" * 100_000 + "]" * 100_000) is None  # no RecursionError
    assert parse_holder("{" * 100_000) is None
    assert parse_holder('{"a": "' + "x" * 70_000 + '"}') is None
    assert parse_holder("not json") is None and parse_holder("[1]") is None


NO_SUCH_GROUP = 2**30  # above any pid_max: even a real signal would reach nobody


class FakeGroup:
    """os.killpg stand-in: the group answers as scripted, every signal is recorded."""

    def __init__(self, alive: list[bool]) -> None:
        self.alive = alive
        self.sent: list[int] = []

    def killpg(self, pgid: int, sig: int) -> None:
        self.sent.append(sig)
        if sig == 0 and not (self.alive.pop(0) if self.alive else False):
            raise ProcessLookupError(pgid)


def test_a_group_found_gone_is_never_probed_or_killed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # alive, then gone, then "alive" again: the id was reused by another process group
    group = FakeGroup([True, False, True, True])
    monkeypatch.setattr(cli_run.os, "killpg", group.killpg)
    monkeypatch.setattr(cli_run.time, "sleep", lambda _s: None)
    child: Any = SimpleNamespace(pid=NO_SUCH_GROUP)
    cli_run._reap_group("test", child, kill_at=float("inf"))
    assert signal.SIGKILL not in group.sent
    assert group.sent == [0, 0]  # stopped probing at the first "gone"


def test_a_group_still_there_at_the_deadline_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    group = FakeGroup([True, True, True])
    monkeypatch.setattr(cli_run.os, "killpg", group.killpg)
    child: Any = SimpleNamespace(pid=NO_SUCH_GROUP)
    cli_run._reap_group("test", child, kill_at=0.0)  # the deadline has passed
    assert group.sent == [0, signal.SIGKILL]


def test_a_sentinel_url_carries_the_sentinels_credentials_and_tls() -> None:
    found = sentinels_from_url(
        "redis+sentinel://app:master-pw@s1,s2:26380/locks/2"
        "?sentinel_username=watch&sentinel_password=s3cret&sentinel_ssl=true&ssl_ca_certs=/ca"
    )
    assert (found.username, found.password) == ("watch", "s3cret")
    assert found.tls is not None and found.tls.ca_certs == "/ca" and found.tls.check_hostname
    assert (found.master.username, found.master.password, found.master.db) == (
        "app",
        "master-pw",
        2,
    )
    assert "s3cret" not in repr(found) and "master-pw" not in repr(found)
    plain = sentinels_from_url("redis+sentinel://s1/locks")
    assert plain.password is None and plain.tls is None


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("?sentinel_password=s3cret&bogus=1", "unknown option"),
        ("?ssl_ca_certs=/ca&sentinel_password=s3cret", "sentinel_ssl=true"),
        ("?sentinel_username=watch", "no sentinel_password"),
        ("?sentinel_ssl=maybe&sentinel_password=s3cret", "true or false"),
    ],
)
def test_a_bad_sentinel_query_is_a_config_error_without_the_password(query: str, said: str) -> None:
    with pytest.raises(fencelock.ConfigError, match=said) as info:
        sentinels_from_url(f"redis+sentinel://s1/locks{query}")
    assert "s3cret" not in str(info.value)
