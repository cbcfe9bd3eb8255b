"""``fencelock run`` reads each slice's :class:`Unavailable`: failures that no retry changes
(a refused password, a missing database, an unknown host, TLS on a plain port) end the wait at
once when they alone deny a majority; transient ones (refused, timed out) are waited out.
Pure logic: the causes are built here as the engine reports them."""

from __future__ import annotations

import socket
import ssl

import pytest

from fencelock import ServerVote
from fencelock._engine.handshake import HandshakeError
from fencelock._engine.resp import ReplyError
from fencelock.cli.common import NOT_TLS_HINT, permanent_reason, read_failures


def _handshake(command: str, message: str) -> HandshakeError:
    return HandshakeError("h:1/0", command, ReplyError(message))


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        (_handshake("AUTH", "WRONGPASS invalid username-password pair"), "password was refused"),
        (_handshake("INFO", "NOAUTH Authentication required."), "needs a password"),
        (_handshake("SELECT", "ERR DB index is out of range"), "no such database index"),
        (OSError(socket.EAI_NONAME, "cannot resolve 'nohost.invalid'"), "unknown host"),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), NOT_TLS_HINT),
    ],
)
def test_permanent_causes(cause: BaseException, reason: str) -> None:
    found = permanent_reason(cause)
    assert found is not None and reason in found


@pytest.mark.parametrize(
    "cause",
    [
        ConnectionRefusedError(111, "connect: Connection refused"),
        ConnectionResetError(104, "reset"),
        TimeoutError("no answer within 1.000 s"),
        OSError(socket.EAI_AGAIN, "Temporary failure in name resolution"),
        _handshake("INFO", "LOADING Redis is loading the dataset in memory"),
        None,
    ],
)
def test_transient_causes(cause: BaseException | None) -> None:
    assert permanent_reason(cause) is None


def test_a_timeout_on_a_port_found_plain_is_the_wrong_scheme() -> None:
    assert permanent_reason(TimeoutError("no answer"), plain_port=True) == NOT_TLS_HINT


def _error(name: str, cause: BaseException) -> ServerVote:
    return ServerVote(name, "error", cause)


def test_one_permanent_among_three_is_not_hopeless_two_are() -> None:
    wrong = _handshake("AUTH", "WRONGPASS")
    one = read_failures([_error("a", wrong), ServerVote("b", "granted"), ServerVote("c", "held")])
    assert (one.quorum, one.hopeless) == (2, False)
    two = read_failures([_error("a", wrong), _error("b", wrong), ServerVote("c", "granted")])
    assert two.hopeless
    line = two.give_up_line()
    assert "2 of 3 servers fail for good" in line and "password was refused" in line
    assert "\n" not in line


def test_transient_failures_are_never_hopeless_and_say_what_is_left() -> None:
    refused = ConnectionRefusedError(111, "refused")
    reading = read_failures(
        [_error("a", refused), ServerVote("b", "granted"), ServerVote("c", "held")]
    )
    assert not reading.hopeless
    assert reading.progress_line().startswith("1 of 3 servers failing")
    assert "one more failure and no lock can be taken" in reading.progress_line()
    all_down = read_failures([_error(n, refused) for n in "abc"])
    assert not all_down.hopeless and "no majority now" in all_down.progress_line()
    five = read_failures([_error("a", refused), *(ServerVote(n, "granted") for n in "bcde")])
    assert "2 more failures" in five.progress_line()


def test_a_single_server_failing_for_good_is_hopeless() -> None:
    reading = read_failures([_error("a", OSError(socket.EAI_NONAME, "unknown"))])
    assert reading.hopeless and reading.give_up_line().startswith("no lock can be taken")
