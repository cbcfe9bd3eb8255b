"""Key names and Redis Cluster hash tags (pure: no sockets).

Cluster hashes only the text between the first ``{`` of a key and the next ``}`` after it (when
that text is not empty); every key a script touches must land in one slot. ``cluster_tag`` and
``key_slot`` below re-state that rule from the Cluster specification, independently of the code
under test (its slot numbers are the ones ``CLUSTER KEYSLOT`` prints, see the first test);
``tests/integration/test_keys_cluster.py`` asks a real cluster-enabled server.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fencelock._core.keys import lock_keys


def cluster_tag(key: str) -> str | None:
    """The hash tag Cluster uses for ``key``, or None when it hashes the whole key."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end < 0 or end == start + 1:
        return None
    return key[start + 1 : end]


def crc16_xmodem(data: bytes) -> int:
    """CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0 (the Cluster key hash)."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    """The Cluster slot of ``key`` (0..16383), as ``CLUSTER KEYSLOT`` computes it."""
    tag = cluster_tag(key)
    hashed = key if tag is None else tag
    return crc16_xmodem(hashed.encode("utf-8", "surrogatepass")) % 16384


# names rich in braces and the escape character, plus any text at all
brace_heavy = st.text(alphabet="{}%7DBab:", min_size=1, max_size=12)
names = st.one_of(brace_heavy, st.text(min_size=1, max_size=40))


def test_the_crc16_is_the_one_cluster_uses() -> None:
    # the check value of CRC16/XMODEM, and the example of the Cluster specification
    assert crc16_xmodem(b"123456789") == 0x31C3
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    # CLUSTER KEYSLOT answers of a real server (Redis 7 and Valkey 8 agree)
    assert key_slot("somekey") == 11058
    assert key_slot("foo{hash_tag}") == key_slot("{hash_tag}") == 2515
    assert key_slot("fencelock:{}abc}") == 11885  # empty tag: the whole key is hashed


def test_names_without_braces_keep_their_v0_1_keys() -> None:
    keys = lock_keys("orders:42")
    assert keys.script_keys == (
        "fencelock:{orders:42}",
        "fencelock:{orders:42}:fence",
        "fencelock:{orders:42}:holder",
        "fencelock:{orders:42}:waiters",
        "fencelock:{orders:42}:wake",
        "fencelock:{orders:42}:handoff",
        "fencelock:{orders:42}:claimed",  # v0.2: a claimed hand-over
    )


def test_a_name_starting_with_a_closing_brace_gets_a_non_empty_tag() -> None:
    tags = {cluster_tag(key) for key in lock_keys("}abc").script_keys}
    assert len(tags) == 1
    (tag,) = tags
    assert tag  # the empty tag "{}" makes Cluster hash each whole key: six slots
    assert len({key_slot(key) for key in lock_keys("}abc").script_keys}) == 1


@settings(max_examples=500)
@given(name=names)
def test_every_key_of_a_lock_shares_one_non_empty_tag(name: str) -> None:
    keys = lock_keys(name)
    assert len(set(keys.script_keys)) == 7
    tags = {cluster_tag(key) for key in keys.script_keys}
    assert len(tags) == 1
    (tag,) = tags
    assert tag is not None and tag != ""
    assert len({key_slot(key) for key in keys.script_keys}) == 1


@settings(max_examples=500)
@given(first=names, second=names)
def test_different_names_never_share_a_tag(first: str, second: str) -> None:
    tag_first = cluster_tag(lock_keys(first).lock)
    tag_second = cluster_tag(lock_keys(second).lock)
    assert (tag_first == tag_second) == (first == second)


def test_names_that_differ_only_in_braces_or_escapes_get_different_tags() -> None:
    # each of these would collide under a careless escape (or no escape at all)
    family = ["a", "{a", "a}", "{a}", "}a", "%7Da", "{%7Da", "}%7Da", "%7D}a", "%", "{", "}", "{}"]
    tags = [cluster_tag(lock_keys(name).lock) for name in family]
    assert None not in tags
    assert len(set(tags)) == len(family)
