"""RESP2 codec: command encoding, and both parsers (pure Python and hiredis) on any split."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencelock._engine import resp
from fencelock._engine.resp import INCOMPLETE, Parser, ProtocolError, ReplyError, command

PARSERS = [pytest.param(True, id="pure")]
if resp.USING_HIREDIS:
    PARSERS.append(pytest.param(False, id="hiredis"))


# ---- a reference encoder (tagged trees -> bytes, expected value) ----------------------------

_line_bytes = st.binary(max_size=20).filter(lambda b: b"\r" not in b and b"\n" not in b)
_error_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=20)

_leaf = st.one_of(
    st.tuples(st.just("bulk"), st.binary(max_size=40)),
    st.tuples(st.just("simple"), _line_bytes),
    st.tuples(st.just("int"), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.tuples(st.just("nil_bulk")),
    st.tuples(st.just("nil_array")),
    st.tuples(st.just("error"), _error_text),
)
_tree = st.recursive(
    _leaf, lambda inner: st.tuples(st.just("array"), st.lists(inner, max_size=5)), max_leaves=20
)


def encode(tree: tuple[Any, ...]) -> bytes:
    tag = tree[0]
    if tag == "bulk":
        return b"$%d\r\n%s\r\n" % (len(tree[1]), tree[1])
    if tag == "simple":
        return b"+%s\r\n" % tree[1]
    if tag == "int":
        return b":%d\r\n" % tree[1]
    if tag == "nil_bulk":
        return b"$-1\r\n"
    if tag == "nil_array":
        return b"*-1\r\n"
    if tag == "error":
        return b"-%s\r\n" % tree[1].encode()
    return b"*%d\r\n" % len(tree[1]) + b"".join(encode(t) for t in tree[1])


def expected(tree: tuple[Any, ...]) -> object:
    tag = tree[0]
    if tag in ("bulk", "simple", "int"):
        return tree[1]
    if tag in ("nil_bulk", "nil_array"):
        return None
    if tag == "error":
        return ("ReplyError", tree[1])
    return [expected(t) for t in tree[1]]


def plain(value: object) -> object:
    """Replies with ReplyError instances made comparable (exceptions compare by identity)."""
    if isinstance(value, ReplyError):
        assert value.message == str(value)
        return ("ReplyError", value.message)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def drain(parser: Parser) -> list[object]:
    out: list[object] = []
    for _ in range(10_000):
        reply = parser.get()
        if reply is INCOMPLETE:
            return out
        out.append(reply)
    raise AssertionError("parser did not run dry")


def parse_in_chunks(data: bytes, cuts: list[int], pure: bool) -> list[object]:
    parser = Parser(pure=pure)
    out: list[object] = []
    start = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        parser.feed(data[start:cut])
        out += drain(parser)
        start = cut
    return [plain(v) for v in out]


# ---- command ----------------------------------------------------------------------------------


def test_command_encodes_str_bytes_and_int_as_bulk_strings() -> None:
    assert command("SET", b"k\r\n", 10, "é") == (
        b"*4\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$2\r\n10\r\n$2\r\n\xc3\xa9\r\n"
    )
    assert command("PING") == b"*1\r\n$4\r\nPING\r\n"
    assert command("X", -5, b"") == b"*3\r\n$1\r\nX\r\n$2\r\n-5\r\n$0\r\n\r\n"


@pytest.mark.parametrize("bad", [True, 1.5, None, ["a"]])
def test_command_refuses_parts_that_are_not_bytes_str_or_int(bad: object) -> None:
    with pytest.raises(TypeError):
        command("SET", bad)  # type: ignore[arg-type]


def test_command_needs_a_name() -> None:
    with pytest.raises(ValueError):
        command()


@given(st.lists(st.one_of(st.binary(max_size=30), st.text(max_size=10), st.integers()), min_size=1))
def test_a_command_parses_back_as_the_array_of_its_parts(parts: list[bytes | str | int]) -> None:
    parser = Parser(pure=True)
    parser.feed(command(*parts))
    want = [p if isinstance(p, bytes) else str(p).encode() for p in parts]
    assert drain(parser) == [want]


# ---- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("pure", PARSERS)
def test_each_reply_type_becomes_its_python_value(pure: bool) -> None:
    parser = Parser(pure=pure)
    parser.feed(
        b"+OK\r\n$3\r\nabc\r\n$0\r\n\r\n:-42\r\n$-1\r\n*-1\r\n*0\r\n*2\r\n:1\r\n*1\r\n+x\r\n"
    )
    assert drain(parser) == [b"OK", b"abc", b"", -42, None, None, [], [1, [b"x"]]]


@pytest.mark.parametrize("pure", PARSERS)
def test_an_error_reply_is_returned_with_its_kind_also_inside_an_array(pure: bool) -> None:
    parser = Parser(pure=pure)
    parser.feed(b"-NOSCRIPT No matching script.\r\n*2\r\n-NOPERM no\r\n:7\r\n-\r\n")
    top, array, empty = drain(parser)
    assert isinstance(top, ReplyError)
    assert (top.kind, top.message) == ("NOSCRIPT", "NOSCRIPT No matching script.")
    assert isinstance(array, list) and array[1] == 7
    assert isinstance(array[0], ReplyError) and array[0].kind == "NOPERM"
    assert isinstance(empty, ReplyError) and empty.kind == "ERR" and empty.message == ""


@pytest.mark.parametrize("pure", PARSERS)
@pytest.mark.parametrize("stream", [b"?x\r\n", b"$abc\r\n", b":12a\r\n", b"$2\r\nabcd\r\n"])
def test_a_stream_that_is_not_resp_raises_protocol_error(pure: bool, stream: bytes) -> None:
    parser = Parser(pure=pure)
    parser.feed(stream)
    with pytest.raises(ProtocolError):
        drain(parser)


@pytest.mark.parametrize("pure", PARSERS)
def test_nothing_is_returned_until_a_reply_is_complete(pure: bool) -> None:
    parser = Parser(pure=pure)
    assert parser.get() is INCOMPLETE
    parser.feed(b"*2\r\n$5\r\nhel")
    assert parser.get() is INCOMPLETE
    parser.feed(b"lo\r\n:1\r")
    assert parser.get() is INCOMPLETE
    parser.feed(b"\n+next")
    assert parser.get() == [b"hello", 1]
    assert parser.get() is INCOMPLETE


def test_a_large_reply_split_in_many_chunks_parses_once_complete() -> None:
    body = bytes(range(256)) * 1000
    data = command("A", body, "B") * 3
    for pure in [True, False] if resp.USING_HIREDIS else [True]:
        parser = Parser(pure=pure)
        out: list[object] = []
        for i in range(0, len(data), 4093):
            parser.feed(data[i : i + 4093])
            out += drain(parser)
        assert out == [[b"A", body, b"B"]] * 3


@settings(max_examples=150, deadline=None)
@given(st.lists(_tree, min_size=1, max_size=4))
def test_the_pure_parser_gives_the_same_replies_split_at_every_byte(
    trees: list[tuple[Any, ...]],
) -> None:
    data = b"".join(encode(t) for t in trees)
    want = [expected(t) for t in trees]
    assert parse_in_chunks(data, [], pure=True) == want
    for cut in range(1, len(data)):
        assert parse_in_chunks(data, [cut], pure=True) == want
    assert parse_in_chunks(data, list(range(1, len(data))), pure=True) == want


@pytest.mark.skipif(not resp.USING_HIREDIS, reason="hiredis is not installed")
@settings(max_examples=150, deadline=None)
@given(st.lists(_tree, min_size=1, max_size=4), st.lists(st.integers(0, 400), max_size=8))
def test_hiredis_and_the_pure_parser_agree_on_any_stream_and_split(
    trees: list[tuple[Any, ...]], cuts: list[int]
) -> None:
    data = b"".join(encode(t) for t in trees)
    cuts = [c for c in cuts if c < len(data)]
    pure = parse_in_chunks(data, cuts, pure=True)
    fast = parse_in_chunks(data, cuts, pure=False)
    assert pure == fast == [expected(t) for t in trees]


def test_hiredis_is_used_by_default_exactly_when_it_imports() -> None:
    try:
        import hiredis  # noqa: F401
    except ImportError:
        available = False
    else:
        available = True
    assert resp.USING_HIREDIS is available
    assert Parser().using_hiredis is available
    assert Parser(pure=True).using_hiredis is False


def test_without_hiredis_the_pure_parser_is_the_default() -> None:
    code = (
        "import sys; sys.modules['hiredis'] = None\n"
        "from fencelock._engine import resp\n"
        "p = resp.Parser(); p.feed(b'*2\\r\\n-NOPERM x\\r\\n:3\\r\\n')\n"
        "r = p.get()\n"
        "print(resp.USING_HIREDIS, p.using_hiredis, r[0].kind, r[1], p.get())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.split() == ["False", "False", "NOPERM", "3", "INCOMPLETE"]


def test_reply_error_survives_pickling_with_its_kind() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(ReplyError("READONLY You can't write against a replica.")))
    assert (err.kind, err.message) == ("READONLY", "READONLY You can't write against a replica.")
