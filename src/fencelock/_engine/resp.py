"""RESP2 encoding and an incremental reply parser (pure: no sockets, no clock).

Rules of this module:

- :func:`command` encodes one command as an array of bulk strings, the only request form a
  server must accept.
- :class:`Parser` turns a byte stream into replies: bulk and simple strings become ``bytes``,
  integers ``int``, arrays ``list``, nil ``None``, and an error reply a :class:`ReplyError`
  *instance*, returned (never raised), also inside arrays, so one failed command of a pipeline
  or a script does not hide the other replies.
- A malformed stream raises :class:`ProtocolError` (a :class:`ConnectionError`): the connection
  it came from cannot be trusted any more.
- hiredis is used when it imports (:data:`USING_HIREDIS`), else a pure-Python parser; both give
  the same results (a test feeds both the same streams).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "INCOMPLETE",
    "USING_HIREDIS",
    "Parser",
    "ProtocolError",
    "ReplyError",
    "command",
]


class _Incomplete:
    """Type of :data:`INCOMPLETE`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "INCOMPLETE"


INCOMPLETE: Final = _Incomplete()
"""What :meth:`Parser.get` returns while no complete reply is buffered."""


class ReplyError(Exception):
    """An error reply from the server, e.g. ``NOSCRIPT No matching script``.

    ``message`` is the full text, ``kind`` its first word (``"NOSCRIPT"``, ``"NOPERM"``,
    ``"WRONGPASS"``, ``"READONLY"``, ``"ERR"``...). Built with the one string argument
    hiredis passes, so both parsers produce the same object.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = message.split(" ", 1)[0] if message else "ERR"


class ProtocolError(ConnectionError):
    """The byte stream is not RESP2: the connection must be closed."""


def _part(part: bytes | str | int) -> bytes:
    if isinstance(part, bytes):
        return part
    if isinstance(part, str):
        return part.encode()
    if isinstance(part, int) and not isinstance(part, bool):
        return str(part).encode()
    raise TypeError(f"a command part must be bytes, str or int, not {type(part).__name__}")


def command(*parts: bytes | str | int) -> bytes:
    """One command as a RESP2 array of bulk strings (``str`` as UTF-8, ``int`` in decimal).

    >>> command("SET", "k", b"v", 10)
    b'*4\\r\\n$3\\r\\nSET\\r\\n$1\\r\\nk\\r\\n$1\\r\\nv\\r\\n$2\\r\\n10\\r\\n'
    """
    if not parts:
        raise ValueError("a command needs at least its name")
    return b"*%d\r\n" % len(parts) + bulks(parts)


def bulks(parts: tuple[bytes | str | int, ...]) -> bytes:
    """``parts`` as RESP bulk strings, without an array header (the tail of a command whose
    head was encoded once). Short strings and integers (a lock's ttl, flags, windows) are
    encoded once and remembered."""
    out: list[bytes] = []
    append = out.append
    small = _small
    for part in parts:
        data: bytes
        if type(part) is str:
            bulk = small.get(part)
            if bulk is not None:
                append(bulk)
                continue
            data = part.encode()
            if len(part) <= _SMALL_STR:
                append(_remember(part, data))
                continue
        elif type(part) is int:
            bulk = small.get(part)
            if bulk is None:
                bulk = _remember(part, b"%d" % part)
            append(bulk)
            continue
        elif type(part) is bytes:
            data = part
        else:
            data = _part(part)
        append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _remember(part: str | int, data: bytes) -> bytes:
    bulk = b"$%d\r\n%s\r\n" % (len(data), data)
    if len(_small) >= _SMALL_MAX:
        _small.clear()
    _small[part] = bulk
    return bulk


#: Encoded bulk strings of short strings and integers, by value (at most _SMALL_MAX).
_small: dict[str | int, bytes] = {}
_SMALL_STR = 16
_SMALL_MAX = 4096


# --------------------------------------------------------------------------------------------
# the pure-Python reader
# --------------------------------------------------------------------------------------------

_COMPACT_AT = 1 << 16  # drop consumed bytes once this many have piled up at the front


class _PyReader:
    """Incremental RESP2 reader: a buffer and the offset of the first unconsumed byte.

    A reply split anywhere is re-parsed from its first byte once more data arrives; lock
    replies are a few dozen bytes, so this costs nothing and keeps the parser stateless.
    """

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos >= _COMPACT_AT:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def gets(self) -> object:
        if self._pos >= len(self._buf):
            return INCOMPLETE
        parsed = self._parse(self._pos)
        if parsed is None:
            return INCOMPLETE
        value, self._pos = parsed
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        return value

    def _line(self, start: int, end: int) -> int:
        try:
            return int(self._buf[start:end])
        except ValueError:
            raise ProtocolError(f"bad length or integer {bytes(self._buf[start:end])!r}") from None

    def _parse(self, pos: int) -> tuple[object, int] | None:
        """(reply, position after it), or None when the reply is not complete yet."""
        buf = self._buf
        if pos >= len(buf):
            return None
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        kind = buf[pos]
        if kind == 0x24:  # $ bulk string
            size = self._line(pos + 1, eol)
            if size < 0:
                return None, eol + 2
            end = eol + 2 + size
            if len(buf) < end + 2:
                return None
            if buf[end : end + 2] != b"\r\n":
                raise ProtocolError("bulk string not terminated by CRLF")
            return bytes(buf[eol + 2 : end]), end + 2
        if kind == 0x2A:  # * array
            count = self._line(pos + 1, eol)
            if count < 0:
                return None, eol + 2
            items: list[object] = []
            at = eol + 2
            for _ in range(count):
                parsed = self._parse(at)
                if parsed is None:
                    return None
                items.append(parsed[0])
                at = parsed[1]
            return items, at
        if kind == 0x2B:  # + simple string
            return bytes(buf[pos + 1 : eol]), eol + 2
        if kind == 0x3A:  # : integer
            return self._line(pos + 1, eol), eol + 2
        if kind == 0x2D:  # - error
            return ReplyError(buf[pos + 1 : eol].decode("utf-8", "replace")), eol + 2
        raise ProtocolError(f"unexpected reply type byte {bytes([kind])!r}")


# --------------------------------------------------------------------------------------------
# hiredis, when available
# --------------------------------------------------------------------------------------------

try:
    import hiredis as _hiredis
except ImportError:  # pragma: no cover - exercised by the pure-Python test paths
    _hiredis = None  # type: ignore[assignment]

USING_HIREDIS: Final[bool] = _hiredis is not None
"""True when :class:`Parser` uses hiredis by default."""


def _hiredis_reader() -> object:
    assert _hiredis is not None
    # no encoding: replies stay bytes, as in the pure reader. RESP2 has no booleans, so the
    # False hiredis returns while a reply is incomplete is unambiguous.
    return _hiredis.Reader(protocolError=ProtocolError, replyError=ReplyError)


class Parser:
    """Replies out of a byte stream: :meth:`feed` bytes, :meth:`get` replies.

    ``pure=True`` forces the pure-Python reader even when hiredis is installed (tests use it to
    check that both agree).
    """

    __slots__ = ("_reader", "using_hiredis")

    def __init__(self, *, pure: bool = False) -> None:
        self.using_hiredis: bool = USING_HIREDIS and not pure
        self._reader: Any = _hiredis_reader() if self.using_hiredis else _PyReader()

    def feed(self, data: bytes) -> None:
        """Append bytes received from the server."""
        self._reader.feed(data)

    def fill(self, replies: list[object], want: int) -> bool:
        """Move complete replies into ``replies`` until it holds ``want``; True once it does.

        Raises:
            ProtocolError: the stream is not RESP2, or holds a reply beyond ``want`` (the
                server answered something nobody asked: the connection must be closed).
        """
        gets = self._reader.gets
        while len(replies) < want:
            reply = gets()
            if reply is False or reply is INCOMPLETE:
                return False
            replies.append(reply)
        extra = gets()
        if extra is not False and extra is not INCOMPLETE:
            raise ProtocolError("more replies than commands sent")
        return True

    def get(self) -> object:
        """The next complete reply, or :data:`INCOMPLETE`.

        Raises:
            ProtocolError: the stream is not RESP2 (the connection must be closed).
        """
        reply: object = self._reader.gets()
        return INCOMPLETE if reply is False else reply
