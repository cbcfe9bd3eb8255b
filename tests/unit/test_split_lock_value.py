"""Splitting a lock key's value into token and holder info (pure; the scripts' side is in
tests/integration/test_lock_value.py)."""

from __future__ import annotations

import pytest

from fencelock._core.holder_json import (
    LOCK_VALUE_SEPARATOR,
    LOCK_VALUE_WAITERS_SEPARATOR,
    lock_token,
    split_lock_value,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"ab12" + b"\xff" + b'{"pid":1}', (b"ab12", b'{"pid":1}')),
        (b"ab12", (b"ab12", None)),  # holder_info=False, a hand-over, or fencelock 0.3
        (b"hcafe", (b"hcafe", None)),
        (b"ab12\xff", (b"ab12", b"")),
        (b"ab12\xff{\xff}", (b"ab12", b"{\xff}")),  # only the first byte 255 separates
        (b"ab12\xfe" + b'{"pid":1}', (b"ab12", b'{"pid":1}')),  # marked: a waiter registered
        (b"ab12\xfe", (b"ab12", b"")),
        (b"ab12\xfe{\xff}", (b"ab12", b"{\xff}")),
    ],
)
def test_split_lock_value(value: bytes, expected: tuple[bytes, bytes | None]) -> None:
    assert split_lock_value(value) == expected


@pytest.mark.parametrize("separator", [LOCK_VALUE_SEPARATOR, LOCK_VALUE_WAITERS_SEPARATOR])
def test_the_separators_are_in_no_utf8_text(separator: bytes) -> None:
    with pytest.raises(UnicodeDecodeError):
        separator.decode()
    assert separator not in "".join(map(chr, range(0x110000))).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), (b"ab12", b"ab12"), (b"ab12\xfe{}", b"ab12")]
)
def test_lock_token(value: bytes | None, expected: bytes | None) -> None:
    assert lock_token(value) == expected
