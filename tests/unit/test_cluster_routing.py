"""The pure part of Cluster support: slots, redirect parsing, and which node a call goes to
(no sockets: ClusterServer only keeps books; the drivers do the I/O)."""

from __future__ import annotations

import pytest

from fencelock import ConfigError
from fencelock._engine.address import Address, cluster_seed_from_url, is_cluster_url
from fencelock._engine.cluster import (
    SLOTS,
    ClusterServer,
    Redirect,
    key_slot,
    parse_redirect,
    parse_slots,
)
from fencelock._engine.resp import ReplyError


def test_key_slot_hashes_the_tag_only() -> None:
    assert key_slot("foo") == 12182  # the value Redis documents for CLUSTER KEYSLOT foo
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("foo{}{bar}") == key_slot("foo{}{bar}")  # empty tag: the whole key
    assert key_slot("foo{}{bar}") != key_slot("bar")
    assert all(0 <= key_slot(f"k{i}") < SLOTS for i in range(1000))


def test_moved_and_ask_are_parsed_and_other_errors_are_not() -> None:
    assert parse_redirect(ReplyError("MOVED 3999 127.0.0.1:6381")) == Redirect(
        False, 3999, "127.0.0.1", 6381
    )
    assert parse_redirect(ReplyError("ASK 12 ::1:7000")) == Redirect(True, 12, "::1", 7000)
    assert parse_redirect(ReplyError("MOVED 3999 :6381")) == Redirect(False, 3999, "", 6381)
    for other in ("ERR x", "MOVED", "MOVED x 1:2", "MOVED 99999 h:1", "ASK 1 h:0", "TRYAGAIN"):
        assert parse_redirect(ReplyError(other)) is None
    assert parse_redirect(b"OK") is None


def test_cluster_slots_reply_is_parsed_or_refused_whole() -> None:
    reply = [[0, 99, [b"127.0.0.1", 7000, b"id0"]], [100, 16383, [b"", 7001, b"id1"]]]
    assert parse_slots(reply) == [(0, 99, "127.0.0.1", 7000), (100, 16383, "", 7001)]
    assert parse_slots(ReplyError("ERR This instance has cluster support disabled")) is None
    assert parse_slots([[0, 99999, [b"h", 1]]]) is None
    assert parse_slots([[0, 1]]) is None


def _cluster() -> ClusterServer:
    return ClusterServer(Address(host="10.0.0.1", port=7000, username="app", password="pw"))


def test_calls_go_to_the_seed_until_a_map_or_a_moved_says_otherwise() -> None:
    cluster = _cluster()
    key = "fencelock:{a}"
    assert cluster.route((key,)).address.port == 7000
    node, asking = cluster.redirected(ReplyError(f"MOVED {key_slot(key)} 10.0.0.2:7001")) or (
        None,
        None,
    )
    assert node is not None and not asking
    assert node.address == Address(host="10.0.0.2", port=7001, username="app", password="pw")
    assert cluster.route((key,)) is node  # the MOVED updated the map
    assert cluster.wants_map() and not cluster.wants_map()  # one call asks for the whole map


def test_ask_sends_one_call_elsewhere_without_changing_the_map() -> None:
    cluster = _cluster()
    key = "fencelock:{a}"
    cluster.learn_map([[0, SLOTS - 1, [b"10.0.0.1", 7000, b"id"]]])
    redirect = cluster.redirected(ReplyError(f"ASK {key_slot(key)} 10.0.0.3:7002"))
    assert redirect is not None and redirect[1] is True
    assert redirect[0].address.port == 7002
    assert cluster.route((key,)).address.port == 7000


def test_a_failed_node_is_avoided_and_the_map_asked_for_again() -> None:
    cluster = _cluster()
    cluster.learn_map(
        [[0, 8000, [b"10.0.0.1", 7000, b"a"]], [8001, SLOTS - 1, [b"10.0.0.2", 7001, b"b"]]]
    )
    assert cluster.wants_map()  # stale at first
    key = next(f"k{i}" for i in range(100) if key_slot(f"k{i}") <= 8000)
    owner = cluster.route((key,))
    assert owner.address.port == 7000
    cluster.node_failed(owner)
    assert cluster.route((key,)).address.port == 7001  # another node, which redirects
    assert cluster.wants_map()


def test_a_cluster_vote_keeps_one_identity_as_a_primary() -> None:
    from fencelock._engine.handshake import Identity

    cluster = _cluster()
    cluster.learned(Identity("r1", "slave", "valkey", (8, 1, 0), 5))
    cluster.learned(Identity("r2", "master", "valkey", (8, 1, 0), 1))  # another node
    assert cluster.identity is not None
    assert cluster.identity.role == "master"
    assert cluster.identity.run_id.endswith("r1")
    assert cluster.identity.restarted_at is None


def test_cluster_urls() -> None:
    assert is_cluster_url("redis+cluster://h:1") and is_cluster_url("valkeys+cluster://h")
    assert not is_cluster_url("redis://h:1")
    seed = cluster_seed_from_url("rediss+cluster://u:p@h:7000?ssl_cert_reqs=none")
    assert (seed.host, seed.port, seed.username, seed.password) == ("h", 7000, "u", "p")
    assert seed.tls is not None
    with pytest.raises(ConfigError, match="only database 0"):
        cluster_seed_from_url("redis+cluster://h:7000/2")
