"""The properties checked on a schedule's history, on the simulation's true time axis.

Pure functions of a :class:`~tools.sim.world.History`; each returns the violations found as
short texts (empty: the property holds). Each has a known-bad-history unit test
(``tests/sim/test_checkers.py``): a checker that never fires proves nothing.

- ``mutual_exclusion``: no two leases of one key valid at the same true time. A lease is
  valid from when ``acquire()`` returned to the earlier of its local deadline and the start of
  its release. (The world's server clocks follow true time, so no clock bound is broken.)
  One exception, documented: a single server restarted empty loses its locks, so on N = 1 an
  overlap across a wiped restart is allowed (the fences must still order the two leases).
- ``fence_order``: fences of one key strictly grow in grant order.
- ``no_ghost_key``: no lock key is held, past the cleanup window and with no fault in that
  window, by a token no grant ever had (an acquire run twice, or told NotAcquired while its
  SET landed); and after every fault healed each key can be taken within half a lease.
- ``confirmed_release_applied``: a release reported confirmed left no key behind.
- ``no_stale_registration``: an acquire that waited (a Lock's, a permit's, a reader's, a
  writer's) leaves no registration in its lock's waiters (on a healthy server, past the
  cleanup window, no fault in it) once its lease's release was confirmed: not even where the
  winning attempt was refused.
- ``no_unexpected_error``: no exception other than NotAcquired / Unavailable / LockLost
  reached a client.
- ``rw_exclusion``: an RWLock's write lease never valid while a read lease or another write
  lease is (its readers and writers are left out of ``mutual_exclusion``; ``fence_order``
  orders them together: one fence register).
- ``one_leader_per_term``: an election's terms: none granted twice, growing in grant order,
  never two valid at once (left out of ``mutual_exclusion`` and ``fence_order``).
- ``no_foreign_lease_use``: no script run with a grant's token by another process (a forked
  child's inherited lease is its parent's).
- ``guard_refuses_older_writer`` (with the fenced store, ``--store``): the store's history is
  as if serialised by fence, overlapping leases included (:mod:`tools.sim.store`).
- ``honest_loss``: a lease is reported lost ("no longer ours") only when it was: never while
  a majority of the servers held its token throughout; a loss for want of a confirmation only
  once its local deadline has passed.
- ``lock_when_free``: liveness: a Lock's ``acquire()`` is not refused (NotAcquired) when
  nothing held or asked for its key during its wait and no fault touched the servers.
- ``rw_when_free``: liveness: an RWLock acquire is not refused when its lock was free (no
  lease, no other acquire) for its one attempt or the last second of its wait, no fault.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from fencelock._core.handover import HANDED_PREFIX

from .store import guard_refuses_older_writer
from .world import Grant, History

PROPERTIES = (
    "mutual_exclusion",
    "fence_order",
    "no_ghost_key",
    "confirmed_release_applied",
    "no_stale_registration",
    "no_unexpected_error",
    "grant_lands_everywhere",
    "lease_within_keys",
    "grant_valid_at_return",
    "semaphore_limit",
    "permit_when_free",
    "rw_exclusion",
    "one_leader_per_term",
    "no_foreign_lease_use",
    "guard_refuses_older_writer",
    "honest_loss",
    "lock_when_free",
    "rw_when_free",
)

#: A refused permit counts as a liveness failure only when no fault touched the servers or
#: the network from this long before it asked until it was refused, and no server restarted
#: from a lease (plus this) before (restart_delay: it would not vote yet).
LIVENESS_QUIET_S = 1.0

#: A grant's acquire must have run on every server within this long (s) of its grant, when
#: no fault touched [its round's start - QUIET_BEFORE_S, grant + LANDING_S] (message delays are
#: at most a few ms without a fault: a NOSCRIPT straggler's EVAL is well inside it).
LANDING_S = 0.15
QUIET_BEFORE_S = 2.0


def _window(grant: Grant) -> tuple[float, float]:
    end = grant.deadline if grant.ended is None else min(grant.deadline, grant.ended)
    return grant.at, end


def _grants_by_key(history: History) -> dict[str, list[Grant]]:
    """Each key's grants in the order their acquire() returned."""
    by_key: dict[str, list[Grant]] = defaultdict(list)
    for grant in history.grants:
        by_key[grant.key].append(grant)
    return {key: sorted(grants, key=lambda g: g.at) for key, grants in by_key.items()}


#: Grants the lock checkers (mutual_exclusion, fence_order) leave to their own checker: a
#: read-write lock's leases (``rw_exclusion``: readers share) and an election's terms
#: (``one_leader_per_term``).
FAMILY_KINDS = frozenset({"read", "write", "election"})


def _lock_grants(history: History) -> History:
    """``history`` with only the grants the lock checkers read (a copy when any is left out)."""
    if not any(g.kind in FAMILY_KINDS for g in history.grants):
        return history
    import dataclasses

    return dataclasses.replace(
        history, grants=[g for g in history.grants if g.kind not in FAMILY_KINDS]
    )


def _overlaps(
    history: History, key: str, ordered: list[Grant], shared: frozenset[str] = frozenset()
) -> list[str]:
    """Two leases of ``ordered`` (one key, in grant order) valid at the same true time, but
    for the documented exceptions; two leases whose kinds are both in ``shared`` (readers)
    may overlap."""
    found: list[str] = []
    for i, a in enumerate(ordered):
        a_start, a_end = _window(a)
        for b in ordered[i + 1 :]:
            b_start, b_end = _window(b)
            if b_start >= a_end:
                break
            if a.kind in shared and b.kind in shared:
                continue
            # (a hand-over's lease counts from when its claimer heard it: the server granted
            # it up to a lease earlier, so the window starts a lease before)
            # (a MultiLock's earlier key was granted well before it returned: from the
            # earlier of the two rounds)
            first = min(a.start or a_start, b.start or b_start)
            since = first - (a_end - (a.start or a_start))
            if history.clock_broken(since, b_start):
                # a server clock jumped past the drift allowance: its keys may expire
                # before their leases' deadlines (the fences must still order them)
                continue
            if history.servers == 1 and any(since <= t <= b_start for t in history.wiped_at):
                # one server restarted empty loses its locks whatever the client does
                # (documented; restart_delay is for N > 1): the fences must still order
                # them, which fence_order checks
                continue
            if _unseen_restart(history, b.client, since, b_start):
                # a server restarted empty that b's process first reached after the restart:
                # restart_delay knows only restarts a process saw (documented,
                # docs/deploying.md); the fences must still order them
                continue
            if b_end > b_start and a_end > a_start:
                found.append(
                    f"{key}: {a.client}{_as(a)} (fence {a.fence}) valid until "
                    f"{a_end - 1000:.4f}, {b.client}{_as(b)} (fence {b.fence}) granted at "
                    f"{b_start - 1000:.4f}"
                )
    return found


def _unseen_restart(history: History, client: str, since: float, until: float) -> bool:
    """Whether a server restarted empty between ``since`` and ``until`` (true times) that the
    process of ``client`` ("c0/j1/t0") had not reached before it restarted."""
    process = client.split("/", 1)[0]
    for at, index in history.wiped:
        if since <= at <= until:
            first = history.contacts.get((process, index))
            if first is None or first > at:
                return True
    return False


def _as(grant: Grant) -> str:
    return f" ({grant.kind})" if grant.kind in ("read", "write") else ""


def mutual_exclusion(history: History) -> list[str]:
    found: list[str] = []
    for key, ordered in _grants_by_key(_lock_grants(history)).items():
        found += _overlaps(history, key, ordered)
    return found


def _fence_steps(
    history: History, key: str, by_return: list[Grant], what: str, *, equal: bool = True
) -> list[str]:
    found: list[str] = []
    # A was acknowledged (acquire() returned) before B's winning round began: then
    # fence(A) < fence(B). Rounds that overlap are not ordered: a round that started
    # before A's grant may run on the servers after A's release (a delayed request,
    # seed 5649), and a MultiLock's first key is granted long before it returns.
    for a, b in itertools.permutations(by_return, 2):
        if a.at < _won_from(b) and b.fence <= a.fence:
            if not equal and b.fence == a.fence:
                continue  # reported on its own
            if _fence_may_step_back(history, a, b):
                continue
            found.append(
                f"{key}: {what} {b.fence} ({b.client}{_as(b)}) after {a.fence} ({a.client}{_as(a)})"
            )
    return found


def _handed(token: str) -> bool:
    """Whether ``token`` is a hand-over's grant (a release issued it for the next waiter)."""
    return token.startswith(HANDED_PREFIX)


def _won_from(grant: Grant) -> float:
    """True time the round that won ``grant`` began. A handed-over grant (token ``h...``) was
    won by its wait for the hand-over, which began after acquire() was called: the releaser's
    script granted it and issued its fence then, and the claim may be heard much later (a
    paused client reads it from its socket when it runs again; seed 126721219), so the time
    it was heard (``start``, its ``acquired_at``) does not order it."""
    if _handed(grant.token) and grant.asked:
        return grant.asked
    return grant.start or grant.at


def _fence_may_step_back(history: History, a: Grant, b: Grant) -> bool:
    """A server clock ran ahead past its bound and a server lost its fence register between
    the two: documented (DESIGN.md "Where it can still fail"), the TIME floor of a clock
    behind cannot cover that skew."""
    first, last = (a, b) if a.at <= b.at else (b, a)
    return history.clock_broken(0.0, last.at) and any(
        (first.start or first.at) <= t <= last.at for t in history.wiped_at
    )


def fence_order(history: History) -> list[str]:
    found: list[str] = []
    lock_grants = _lock_grants(history)
    rw = [g for g in history.grants if g.kind in ("read", "write")]
    for key, by_return in _grants_by_key(lock_grants).items():
        found += _fence_steps(history, key, by_return, "fence")
    # a read-write lock's readers and writers bump one fence register: all of them grow
    for key, by_return in _grants_by_key(History(grants=rw)).items():
        found += _fence_steps(history, key, by_return, "fence")
    return found


def rw_exclusion(history: History) -> list[str]:
    """A read-write lock: no write lease valid at a true instant while any read lease of the
    key is, nor two write leases (readers share), with the lock's exceptions (a broken clock
    bound; a wiped restart of the only server). Windows as for ``mutual_exclusion``."""
    rw = [g for g in history.grants if g.kind in ("read", "write")]
    found: list[str] = []
    for key, ordered in _grants_by_key(History(grants=rw)).items():
        found += _overlaps(history, key, ordered, shared=frozenset({"read"}))
    return found


def one_leader_per_term(history: History) -> list[str]:
    """An election: no two leaders granted the same term; terms strictly grow in the order
    leadership was granted (a term acknowledged before another's winning round began is the
    smaller); never two valid leaders at one true instant. The lock's exceptions: a term may
    repeat or step back only across a broken clock bound *and* a wiped restart; two leaders
    overlap only across a broken clock bound (or a wiped restart of the only server)."""
    terms = [g for g in history.grants if g.kind == "election"]
    found: list[str] = []
    for key, ordered in _grants_by_key(History(grants=terms)).items():
        for a, b in itertools.combinations(ordered, 2):
            if a.fence == b.fence and not _fence_may_step_back(history, a, b):
                found.append(
                    f"{key}: term {a.fence} granted twice: {a.client} at {a.at - 1000:.4f}, "
                    f"{b.client} at {b.at - 1000:.4f}"
                )
        found += _fence_steps(history, key, ordered, "term", equal=False)
        found += _overlaps(history, key, ordered)
    return found


def grant_lands_everywhere(history: History) -> list[str]:
    """Every grant's acquire ran on every server (the script, not only its EVALSHA: a server
    that answered NOSCRIPT, even after the round was decided, gets the script in full), when
    no fault touched the servers or the network around it (a SCRIPT FLUSH is not a fault
    here: the library must absorb it) and its holder kept its loop long enough."""
    found: list[str] = []
    if not history.landed:
        return found
    for grant in history.grants:
        if _handed(grant.token):  # a hand-over's grant: its acquire was another's
            continue
        if grant.key.startswith("sem/"):  # a permit (sem_acquire, not acquire)
            continue
        if grant.ended is not None and grant.ended - grant.at < LANDING_S:
            continue
        began = min(t for t in (grant.asked, grant.start, grant.at) if t)
        if not history.quiet(began - QUIET_BEFORE_S, grant.at + LANDING_S):
            continue
        token = grant.token.encode()
        missing = [i for i, ran in enumerate(history.landed) if token not in ran]
        if missing:
            found.append(
                f"{grant.client}'s grant of {grant.key} (fence {grant.fence}) at "
                f"{grant.at - 1000:.4f} never ran on sim{missing[0]} "
                f"({len(missing)}/{len(history.landed)} servers missed it)"
            )
    return found


def grant_valid_at_return(history: History) -> list[str]:
    """acquire() never returns a lease whose local deadline has passed (a round that took
    longer than its validity is not a grant), unless the process was paused (pause_client)
    between its round's start and the return: nothing can stop a pause after the check."""
    found: list[str] = []
    for grant in history.grants:
        if grant.returned_deadline > grant.at:
            continue
        if history.client_paused(grant.start or grant.at, grant.at):
            continue
        found.append(
            f"{grant.client}'s acquire of {grant.key} (fence {grant.fence}) returned at "
            f"{grant.at - 1000:.4f} a lease valid until {grant.returned_deadline - 1000:.4f}"
        )
    return found


def semaphore_limit(history: History) -> list[str]:
    """Never more than ``limit`` permits valid at one true instant (each on a slot in
    ``0..limit-1``), except across a broken clock bound, or a wiped restart of the only server
    (as for the lock)."""
    found: list[str] = []
    permits = [g for g in history.grants if g.key.startswith("sem/")]
    for grant in permits:
        slot = int(grant.key.rsplit("slot", 1)[1])
        if not 0 <= slot < history.limit:
            found.append(f"{grant.client}'s permit is on slot {slot} (limit {history.limit})")
    edges: list[tuple[float, int, Grant]] = []
    for grant in permits:
        begin, end = _window(grant)
        if end > begin:
            edges.append((begin, 1, grant))
            edges.append((end, -1, grant))
    edges.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    valid: list[Grant] = []
    for at, step, grant in edges:
        if step < 0:
            valid.remove(grant)
            continue
        valid.append(grant)
        if len(valid) <= history.limit:
            continue
        since = min((g.start or g.at) for g in valid) - history.ttl
        if history.clock_broken(since, at) or (
            history.servers == 1 and any(since <= t <= at for t in history.wiped_at)
        ):
            continue
        holders = ", ".join(f"{g.client} ({g.key}, fence {g.fence})" for g in valid)
        found.append(
            f"{len(valid)} permits valid at {at - 1000:.4f}, limit {history.limit}: {holders}"
        )
        break
    return found


def permit_when_free(history: History) -> list[str]:
    """Liveness: with every server healthy (no fault from a second before the ask until the
    refusal, no restart within a lease before it) and a permit free for the whole wait,
    ``Semaphore.acquire()`` does not raise NotAcquired (nor ``try_acquire()`` return None)
    when no other ask was in flight, even if the servers disagree on which slots are taken
    (keys an earlier fault left on a minority: the workload's lasting split leaves them for
    longer than a wait; ``_core/semaphore.py``: "a split vote converges while capacity
    exists"). A permit occupies its slot from its grant to its release if that was confirmed,
    else to its deadline (its key may stay until then)."""
    found: list[str] = []
    permits = [g for g in history.grants if g.key.startswith("sem/")]
    for who, asked, refused in history.permits_refused:
        if not history.quiet(asked - LIVENESS_QUIET_S, refused) or any(
            asked - history.ttl - LIVENESS_QUIET_S <= t <= refused for t in history.restarted_at
        ):
            continue
        if any(
            other != who and start < refused and end > asked
            for other, start, end in history.permit_attempts
        ):
            continue  # another ask in flight may hold a slot on some servers meanwhile
        edges: list[tuple[float, int]] = []
        for g in permits:
            end = g.ended if g.release == "ok" and g.ended is not None else g.deadline
            begin, end = min(g.at, g.start or g.at), end + 0.05
            if end > asked and begin < refused:
                edges.append((max(begin, asked), 1))
                edges.append((min(end, refused), -1))
        edges.sort(key=lambda e: (e[0], -e[1]))
        most = count = 0
        for _, step in edges:
            count += step
            most = max(most, count)
        if most < history.limit:
            found.append(
                f"{who} was refused a permit at {refused - 1000:.4f} after asking at "
                f"{asked - 1000:.4f}: at most {most} of {history.limit} were held meanwhile, "
                "no fault"
            )
    return found


def lease_within_keys(history: History) -> list[str]:
    return list(history.outlived)


def no_ghost_key(history: History) -> list[str]:
    return [*history.ghosts, *history.liveness]


def confirmed_release_applied(history: History) -> list[str]:
    return list(history.unapplied)


def no_stale_registration(history: History) -> list[str]:
    return list(history.registrations)


def no_unexpected_error(history: History) -> list[str]:
    return list(history.errors)


def no_foreign_lease_use(history: History) -> list[str]:
    """No process runs a lease's script (a renewal, an extend, a release) with a token that
    another process was granted: a forked child's inherited lease is its parent's, never
    renewed, extended or released there (DESIGN.md "Fork-safe"; recorded by the servers in
    schedules with forks, tools/sim/fork.py)."""
    return list(history.foreign)


#: Loss reasons that claim only that the lease could not be confirmed in time (lost at its
#: local deadline: ``_core/extend.py``), and the fork's (an inherited lease is its parent's).
RAN_OUT_PREFIXES = ("renewal not confirmed before", "max_hold reached")


def honest_loss(history: History) -> list[str]:
    """A lease is reported lost only when it was (issue: "LockLost only when the lease was
    lost"). The library's contract (``LockLost``: "expired, was taken, or could not be
    confirmed"; ``_core/extend.py``) allows two kinds of loss besides a fork's:

    - *refused* ("extend refused": so many servers said "not ours" that no majority can be
      ours): then no majority held its token. Flagged when, at the loss, a majority held its
      token unexpired and none of them ran, since the grant returned, a script with the token
      that may write the key (an acquire straggler): each of those held it from before the
      grant to the loss, so each answered "ours" to every extend in between; a server whose
      clock broke its bound since the grant may have expired it meanwhile (not flagged);
    - *ran out* (a renewal or extend not confirmed, ``max_hold``): only at or after its local
      deadline, never while the lease is still valid.

    Any other reason is flagged: the contract has no third way to lose a lease. A fork's
    inherited lease ("fork") is lost by design (``tools/sim/fork.py``)."""
    found: list[str] = []
    majority = history.servers // 2 + 1
    for loss in history.losses:
        where = f"{loss.client}'s lease on {loss.key} reported lost at {loss.at - 1000:.4f}"
        if loss.reason == "fork":
            continue
        if loss.reason.startswith(RAN_OUT_PREFIXES):
            if loss.at < loss.deadline - 1e-9:
                found.append(
                    f"{where} ({loss.reason}) before its deadline {loss.deadline - 1000:.4f}"
                )
            continue
        if not loss.reason.startswith("extend refused"):
            found.append(f"{where}: {loss.reason} (no such loss in the contract)")
            continue
        if _handed(loss.token) or history.clock_broken(loss.granted, loss.at):
            continue  # (a hand-over's key is written by its previous holder's release)
        if loss.held >= majority:
            found.append(
                f"{where} ({loss.reason}) while {loss.held}/{history.servers} servers held "
                "its token since its grant"
            )
    return found


def _occupied(history: History, g: Grant) -> tuple[float, float]:
    """When lease ``g`` may keep its key from others (true times), for the liveness checks:
    from its round's start (or its ask) to its release if that was confirmed (+50 ms), else
    to 1.5 ttl past the later of its deadline and its end (an extend in flight may land)."""
    begin = min(g.at, g.start or g.at, g.asked or g.at)
    if g.release == "ok" and g.ended is not None:
        return begin, g.ended + 0.05
    return begin, max(g.deadline, g.ended or 0.0) + 1.5 * history.ttl + 0.05


def lock_when_free(history: History) -> list[str]:
    """Liveness, the lock's ``permit_when_free``: a Lock's ``acquire()`` (wait: the client's)
    does not raise NotAcquired when, from ``2 ttl + LIVENESS_QUIET_S`` before it asked until
    it was refused, no fault touched the servers, the network or a client and no server
    restarted (then every key an earlier fault left behind has expired: a key lives at most
    1.5 ttl past its last extend), no other acquire of its key was in flight (nor ended within
    50 ms of its ask: its cleanup), and no lease of its key occupied it. A lease occupies its
    key from its round's start to its release if that was confirmed (+50 ms), else to 1.5 ttl
    past the later of its deadline and its end (an extend in flight may land)."""
    found: list[str] = []
    by_key = _grants_by_key(history)
    for who, key, asked, refused in history.locks_refused:
        since = asked - 2 * history.ttl - LIVENESS_QUIET_S
        if not history.quiet(since, refused) or any(
            since <= t <= refused for t in history.restarted_at
        ):
            continue
        if any(
            (other, start) != (who, asked) and k == key and start < refused and end + 0.05 > asked
            for other, k, start, end in history.lock_attempts
        ):
            continue
        busy = any(
            begin < refused and end > asked
            for begin, end in (_occupied(history, g) for g in by_key.get(key, []))
        )
        if not busy:
            found.append(
                f"{who} was refused {key} at {refused - 1000:.4f} after asking at "
                f"{asked - 1000:.4f}: no lease nor other acquire of it meanwhile, no fault"
            )
    return found


#: How long a waiting RWLock acquire must go on with its lock free before a refusal is a
#: liveness failure (s): a release wakes it at once; with no release to wake it (a lease that
#: ran out), its next attempt comes at most one backoff step (the lease it was told, plus
#: jitter) after the occupancy ``rw_when_free`` already allows for.
RW_FREE_S = 1.0

#: How long after another RWLock acquire returned it may still keep the lock from a reader
#: (s): a writer refused to the end of its wait leaves its intent marker up to 100 ms past it
#: (``rw_write_acquire.lua``), and a refused attempt's partial entries are cleaned up by then.
RW_AFTER_S = 0.15


def rw_when_free(history: History) -> list[str]:
    """Liveness, the read-write lock's ``lock_when_free``: an RWLock acquire, a reader's or a
    writer's, is not refused (NotAcquired, or a try's None) when its lock was free: for the
    whole call if it made one attempt, for the last ``RW_FREE_S`` of its wait if it waited.
    Only when no fault touched the servers, the network or a client from ``2 ttl +
    LIVENESS_QUIET_S`` before it asked (as ``lock_when_free``). Unlike ``lock_when_free`` the
    lock may have been held when it asked (a waiting writer gets the lock when the last reader
    leaves; a writer granted leaves nothing that stops the readers after it). The lock is
    occupied by every read and write lease, as ``lock_when_free`` counts a lease, and by every
    other RWLock acquire from its ask to ``RW_AFTER_S`` after it returned."""
    found: list[str] = []
    leases = [g for g in history.grants if g.kind in ("read", "write")]
    for who, role, once, asked, refused in history.rw_refused:
        since = asked - 2 * history.ttl - LIVENESS_QUIET_S
        if not history.quiet(since, refused) or any(
            since <= t <= refused for t in history.restarted_at
        ):
            continue
        windows = [
            (start, end + RW_AFTER_S)
            for other, start, end in history.rw_attempts
            if (other, start) != (who, asked)
        ]
        windows += [_occupied(history, g) for g in leases]
        free_from = max([since, *(end for begin, end in windows if begin < refused)])
        if free_from > (asked if once else refused - RW_FREE_S):
            continue
        how = "in one attempt" if once else "after waiting"
        found.append(
            f"{who} was refused the {role} lock {how} at {refused - 1000:.4f} (asked at "
            f"{asked - 1000:.4f}): free since {free_from - 1000:.4f}, no fault"
        )
    return found


CHECKS = {
    "mutual_exclusion": mutual_exclusion,
    "fence_order": fence_order,
    "no_ghost_key": no_ghost_key,
    "confirmed_release_applied": confirmed_release_applied,
    "no_stale_registration": no_stale_registration,
    "no_unexpected_error": no_unexpected_error,
    "grant_lands_everywhere": grant_lands_everywhere,
    "lease_within_keys": lease_within_keys,
    "grant_valid_at_return": grant_valid_at_return,
    "semaphore_limit": semaphore_limit,
    "permit_when_free": permit_when_free,
    "rw_exclusion": rw_exclusion,
    "one_leader_per_term": one_leader_per_term,
    "no_foreign_lease_use": no_foreign_lease_use,
    "guard_refuses_older_writer": guard_refuses_older_writer,
    "honest_loss": honest_loss,
    "lock_when_free": lock_when_free,
    "rw_when_free": rw_when_free,
}


def violations(history: History) -> list[tuple[str, str]]:
    """(property, detail) for every violation found."""
    return [(name, detail) for name, check in CHECKS.items() for detail in check(history)]
