"""Tokens come from the OS CSPRNG in pools: every token is handed out once, in threads and
across a fork (a child that repeated its parent's next tokens would make two holders of one
token)."""

from __future__ import annotations

import os
import re
import threading

import pytest

from fencelock._frontend import holder
from fencelock._frontend.holder import POOL_BYTES, TOKEN_BYTES, new_token

HEX = re.compile(r"[0-9a-f]{32}")


def test_a_token_is_128_bits_as_32_hex_digits_and_none_repeats_over_several_pools() -> None:
    per_pool = POOL_BYTES // TOKEN_BYTES
    tokens = [new_token() for _ in range(per_pool * 5 + 3)]
    assert all(HEX.fullmatch(token) for token in tokens)
    assert len(set(tokens)) == len(tokens)


def test_threads_drawing_at_once_never_get_the_same_token() -> None:
    out: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8, timeout=10)

    def draw(index: int) -> None:
        start.wait()
        out[index].extend(new_token() for _ in range(3000))

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    drawn = [token for tokens in out for token in tokens]
    assert len(drawn) == 8 * 3000
    assert len(set(drawn)) == len(drawn)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_repeat_the_tokens_its_parent_has_not_used_yet() -> None:
    new_token()  # the parent's pool is filled: 255 tokens wait in it
    assert holder._tokens, "the pool should hold unread tokens before the fork"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next tokens, to the parent, then out at once
        try:
            os.close(read_end)
            os.write(write_end, "".join(new_token() for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    text = b"".join(chunks).decode()
    child = {text[i : i + 32] for i in range(0, len(text), 32)}
    assert len(child) == 50
    parent = {new_token() for _ in range(50)}
    assert not child & parent
