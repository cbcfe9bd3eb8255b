"""A reentrant lease view can be copied (``copy.copy``/``deepcopy``, as a fork-simulating
test or a user's framework may): a bare instance being filled in must not follow its own
missing entry into endless recursion (found by the simulation: a forked child inheriting a
re-entered lock)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from fencelock._frontend.reentry import Entry, HeldBase


@dataclass
class _Lease:
    token: str
    fence: int


def test_a_reentrant_view_deep_copies_with_its_own_entry() -> None:
    view = HeldBase(Entry(lease=_Lease("t1", 7), depth=2, anchor=None, slot=("k",)))
    copied = copy.deepcopy(view)
    assert (copied.token, copied.fence, copied.depth) == ("t1", 7, 2)
    assert copied._entry is not view._entry  # its own copy, not the original's entry
    copied.fence = 8  # an attribute of the shared lease is still set through the view
    assert copied._entry.lease.fence == 8 and view.fence == 7


def test_a_reentrant_view_shallow_copies_and_a_bare_one_says_what_is_missing() -> None:
    view = HeldBase(Entry(lease=_Lease("t2", 3), depth=1, anchor=None, slot=("k",)))
    assert copy.copy(view).token == "t2"
    bare = HeldBase.__new__(HeldBase)
    try:
        _ = bare.token
    except AttributeError as exc:
        assert "_entry" in str(exc)
    else:
        raise AssertionError("a bare view has no lease to read from")
