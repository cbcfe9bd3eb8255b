"""The connection prelude and what its replies say (pure; real-server checks in test_wire)."""

from __future__ import annotations

import pytest

from fencelock._engine.address import Address
from fencelock._engine.handshake import HandshakeError, Identity, identity_from, prelude
from fencelock._engine.resp import INCOMPLETE, Parser, ReplyError, command

INFO_REDIS = b"# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n"
INFO_VALKEY = (
    b"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n"
    b"run_id:def456\r\nuptime_in_seconds:7\r\n"
)
ROLE = [b"master", 0, []]


def commands_of(payload: bytes) -> list[object]:
    parser = Parser(pure=True)
    parser.feed(payload)
    out = []
    while (reply := parser.get()) is not INCOMPLETE:
        out.append(reply)
    return out


@pytest.mark.parametrize(
    ("address", "sent"),
    [
        (Address(), [[b"INFO", b"server"], [b"ROLE"]]),
        (Address(db=3), [[b"SELECT", b"3"], [b"INFO", b"server"], [b"ROLE"]]),
        (Address(password="pw"), [[b"AUTH", b"pw"], [b"INFO", b"server"], [b"ROLE"]]),
        (
            Address(username="u", password="pw", db=1),
            [[b"AUTH", b"u", b"pw"], [b"SELECT", b"1"], [b"INFO", b"server"], [b"ROLE"]],
        ),
    ],
)
def test_the_prelude_authenticates_selects_then_asks_who_answers(
    address: Address, sent: list[list[bytes]]
) -> None:
    payload, replies = prelude(address)
    assert commands_of(payload) == sent
    assert replies == len(sent)


def test_identity_comes_from_info_and_role_for_both_engines() -> None:
    redis_identity = Identity("abc123", "master", "redis", (7, 0, 15), 42)
    assert identity_from([INFO_REDIS, ROLE]) == redis_identity
    assert identity_from([b"OK", b"OK", INFO_VALKEY, [b"slave", b"h", 1, b"connected", 5]]) == (
        Identity("def456", "slave", "valkey", (8, 1, 8), 7)
    )


def test_a_user_not_allowed_info_or_role_has_no_identity() -> None:
    noperm = ReplyError("NOPERM User app has no permissions to run the 'info' command")
    assert identity_from([noperm, ROLE]) is None
    assert identity_from([INFO_REDIS, noperm]) is None
    assert identity_from([b"garbage", ROLE]) is None


def test_a_refused_auth_names_the_server_and_the_error_but_not_the_password() -> None:
    address = Address(host="h", port=1, username="u", password="hunter2-secret")
    wrongpass = ReplyError("WRONGPASS invalid username-password pair or user is disabled.")
    noauth = ReplyError("NOAUTH Authentication required.")
    with pytest.raises(HandshakeError) as caught:
        identity_from([wrongpass, noauth, noauth], address=address)
    message = str(caught.value)
    assert message.startswith("h:1/0: AUTH refused: WRONGPASS")
    assert "hunter2" not in message
    assert caught.value.reply is wrongpass


def test_a_refused_select_or_a_missing_password_is_a_handshake_error() -> None:
    with pytest.raises(HandshakeError, match="SELECT refused: ERR DB index"):
        identity_from(
            [ReplyError("ERR DB index is out of range"), INFO_REDIS, ROLE], address=Address(db=99)
        )
    with pytest.raises(HandshakeError, match="INFO refused: NOAUTH"):
        identity_from([ReplyError("NOAUTH Authentication required."), ROLE])


def test_a_reply_count_that_does_not_match_the_prelude_is_a_bug() -> None:
    with pytest.raises(ValueError):
        identity_from([INFO_REDIS, ROLE], address=Address(password="x"))
    with pytest.raises(ValueError):
        identity_from([ROLE])


def test_the_prelude_is_plain_resp2_commands() -> None:
    payload, _ = prelude(Address())
    assert payload == command("INFO", "server") + command("ROLE")
