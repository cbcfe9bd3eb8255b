"""Splitting a lock key's value into token and holder info (pure; the scripts' side is in
tests/integration/test_lock_value.py)."""

from __future__ import annotations

import pytest

from fencelock._core.holder_json import LOCK_VALUE_SEPARATOR, split_lock_value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"ab12" + b"\xff" + b'{"pid":1}', (b"ab12", b'{"pid":1}')),
        (b"ab12", (b"ab12", None)),  # holder_info=False, a hand-over, or fencelock 0.3
        (b"hcafe", (b"hcafe", None)),
        (b"ab12\xff", (b"ab12", b"")),
        (b"ab12\xff{\xff}", (b"ab12", b"{\xff}")),  # only the first byte 255 separates
    ],
)
def test_split_lock_value(value: bytes, expected: tuple[bytes, bytes | None]) -> None:
    assert split_lock_value(value) == expected


def test_the_separator_is_in_no_utf8_text() -> None:
    with pytest.raises(UnicodeDecodeError):
        LOCK_VALUE_SEPARATOR.decode()
    assert LOCK_VALUE_SEPARATOR not in "".join(map(chr, range(0x110000))).encode(
        "utf-8", "surrogatepass"
    )
