"""RESP2 for the simulated server: a request parser and a reply encoder (pure, no I/O).

fencelock speaks RESP2 only (``_engine/handshake.py``: no ``HELLO``), and sends every request as
an array of bulk strings (``_engine/resp.py``'s ``command``), so that is the request form parsed
here. :class:`RequestParser` accepts the bytes in any chunking and any number of pipelined
requests; a malformed stream raises :class:`ProtocolError` (the server answers
``-ERR Protocol error`` and closes the connection, as a real one does).

Replies are Python values: ``bytes`` (bulk), ``int`` (integer), ``None`` (nil bulk),
:data:`NIL_ARRAY` (``*-1``: a blocking pop that timed out), ``list`` (array), :class:`Status`
(``+OK``) and :class:`Err` (an error reply). :func:`encode` turns one into bytes.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["NIL_ARRAY", "OK", "Err", "ProtocolError", "RequestParser", "Status", "encode"]


class Status(bytes):
    """A simple-string reply (``+OK``)."""

    __slots__ = ()


class Err:
    """An error reply; ``message`` is its full text, e.g. ``"ERR syntax error"``."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"Err({self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Err) and other.message == self.message

    def __hash__(self) -> int:
        return hash(self.message)


class _NilArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NIL_ARRAY"


NIL_ARRAY: Final = _NilArray()
OK: Final = Status(b"OK")

Reply = bytes | int | None | _NilArray | list["Reply"] | Status | Err


class ProtocolError(ValueError):
    """The request stream is not RESP2 arrays of bulk strings."""


_COMPACT_AT = 65536


class RequestParser:
    """Requests from a byte stream: :meth:`feed` bytes, then :meth:`next` until it returns None."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos and self._pos >= len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif self._pos > _COMPACT_AT:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def pending(self) -> bool:
        """Bytes are buffered that are not yet a whole request (or not yet taken)."""
        return self._pos < len(self._buf)

    def next(self) -> list[bytes] | None:
        """The next complete request (its arguments), or None until more bytes arrive.

        Raises:
            ProtocolError: the stream is not an array of bulk strings.
        """
        buf = self._buf
        pos = self._pos
        size = len(buf)
        if pos >= size:
            return None
        if buf[pos] != 42:  # '*'
            raise ProtocolError(f"expected '*', got {bytes(buf[pos : pos + 1])!r}")
        nl = buf.find(b"\r\n", pos)
        if nl < 0:
            return None
        try:
            count = int(buf[pos + 1 : nl])
        except ValueError:
            raise ProtocolError("invalid multibulk length") from None
        if count > 1024 * 1024:
            raise ProtocolError("invalid multibulk length")
        p = nl + 2
        args: list[bytes] = []
        append = args.append
        for _ in range(count):
            if p >= size:
                return None
            if buf[p] != 36:  # '$'
                raise ProtocolError(f"expected '$', got {bytes(buf[p : p + 1])!r}")
            nl = buf.find(b"\r\n", p)
            if nl < 0:
                return None
            try:
                length = int(buf[p + 1 : nl])
            except ValueError:
                raise ProtocolError("invalid bulk length") from None
            if length < 0:
                raise ProtocolError("invalid bulk length")
            start = nl + 2
            end = start + length
            if end + 2 > size:
                return None
            if buf[end : end + 2] != b"\r\n":
                raise ProtocolError("bulk string not followed by CRLF")
            append(bytes(buf[start:end]))
            p = end + 2
        self._pos = p
        return args


def encode(reply: Any) -> bytes:
    """One reply as RESP2 bytes."""
    kind = type(reply)
    if kind is bytes:
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    if kind is int:
        return b":%d\r\n" % reply
    if reply is None:
        return b"$-1\r\n"
    if kind is list:
        return b"*%d\r\n" % len(reply) + b"".join(encode(item) for item in reply)
    if kind is Status:
        return b"+%s\r\n" % reply
    if kind is Err:
        text = reply.message.replace("\r", " ").replace("\n", " ")
        return b"-%s\r\n" % text.encode("utf-8", "replace")
    if reply is NIL_ARRAY:
        return b"*-1\r\n"
    if kind is bool:
        return b":%d\r\n" % int(reply)
    raise TypeError(f"not a reply: {reply!r}")
