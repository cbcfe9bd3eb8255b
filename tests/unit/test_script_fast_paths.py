"""Where the scripts' uncontended paths return: before any included function is defined.

A script's ``local function`` is built (a closure allocated, and later collected) on every call
that reaches its definition: on Valkey 8.1, the acquire script's included functions cost about
3 µs of a 10 µs call (docs/benchmarks.md). So the free lock's grant, the release of a lease
nobody waited for and the extend of our own value (with holder info, or the compat layer's bare
token) return, or pass, before any include; what they take from ``lock_value.lua`` and
``fence_math.lua`` is written out. That those paths give what the included functions give is
checked on real servers (the fence register's cases in
``tests/integration/test_fence_issue.py``, the lock value's in ``test_lock_value.py``, the
compat layer's bare tokens in ``test_compat*.py``); this checks only that they come first.
"""

from __future__ import annotations

from fencelock._scripts import BY_NAME


def _before(script: str, line: str) -> str:
    source = BY_NAME[script].source.decode()
    assert source.count(line) == 1, f"{script}.lua: {line!r} is not there once"
    return source[: source.index(line)]


def test_the_free_locks_grant_returns_having_built_one_function() -> None:
    before = _before("acquire", "    return granted(floor)\n")
    assert before.count("local function ") == 1  # granted() itself
    assert "local function granted(fence)" in before


def test_an_unwaited_release_returns_having_built_no_function() -> None:
    before = _before("release", "    redis.call('DEL', KEYS[1], KEYS[2], KEYS[7])\n    return 1\n")
    assert "local function " not in before


def test_an_extend_of_our_value_builds_no_function() -> None:
    source = BY_NAME["extend"].source.decode()
    fast_check = "if not (value and ARGV[1] ~= '' and string.sub(value, 1, #ARGV[1]) == ARGV[1]\n"
    guarded = source[source.index(fast_check) :]
    body = guarded[: guarded.index("\nend\nredis.call('PEXPIRE'")]
    # every function is defined inside the check's block, which the common case skips
    assert "local function " not in source[: source.index(fast_check)]
    assert body.count("local function ") == source.count("local function ") > 0
