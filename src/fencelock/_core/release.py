"""Release, written once: compare-and-delete everywhere, repeated later where no answer came.

A paused server applies what its socket buffers held when it wakes, possibly an acquire that
arrives after our release; so servers that did not answer (or were not asked: suspect) get the
release again in the background, once after they answer (see :class:`~.effects.Repeat`). So do
servers that answered "not ours": the acquire round's straggler may still be on its way there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import LockLost, Unavailable
from .effects import Broadcast, Flow, NotSent, Repeat
from .handover import offered_token
from .plan import LockPlan
from .quorum import Outcome, Tally, summary
from .replies import classify_release, with_wait
from .rounds import lost_for_sure
from .verdicts import outage, silent, votes


def release_round(
    plan: LockPlan,
    token: str,
    targets: tuple[int, ...] | None = None,
    *,
    waiter: str = "-",
    next_token: str = "",
    await_only: tuple[int, ...] | None = None,
    grant: str = "",
) -> Flow[Tally]:
    """Release ``token`` on ``targets`` (default: every server); returns the round's tally.
    With ``replicas=k`` a server's release counts once ``WAIT`` saw it on k replicas (else
    the lock could come back with a failover): one short of them is an outage vote.

    ``await_only``: the round ends once these targets answered; the others are sent the
    release all the same (in order after what was sent them before, on a shared connection)
    but not waited for, and the release is repeated there in the background once they
    answer (a cleanup that must not wait for a hung server).

    ``next_token`` (see :mod:`.handover`): where a waiter is registered, the lock is granted
    at once under this token to the first waiter that claims it; ``waiter``: the releaser's
    own waiter id (a holder that claimed a hand-over is still registered as a waiter);
    ``grant`` (see :meth:`LockPlan.grant_tag`): the lease's grant, for a token that is
    granted again.

    With ``plan.tokens_reused`` nothing is repeated (see :func:`repeat_release`)."""
    everyone = plan.everyone
    tally = Tally(len(everyone))
    if targets is None:
        targets = everyone
    elif targets != everyone:
        for index in everyone:
            if index not in targets:
                tally.record(index, Outcome.HELD)
    args = release_args(plan, token, waiter=waiter, next_token=next_token, grant=grant)
    stop = None
    if await_only is not None:
        awaited = await_only

        def stop(tally: Tally) -> bool:
            return all(index in tally.votes for index in awaited)

    yield Broadcast(
        plan.wiring.release,
        targets,
        plan.release_keys,
        args,
        with_wait(plan, classify_release, held=True),
        stop,
        plan.budget_s,
        tally,
        wait=plan.wait,
    )
    if tally.granted == len(targets):
        return tally  # released on every target: nothing can be late
    # "not ours" on a server we target may mean our grant there has not landed yet (a
    # straggler of the acquire round, on another connection): repeat the release there too
    refused = tuple(i for i in targets if tally.votes.get(i, (None, None))[0] is Outcome.HELD)
    unheard: tuple[int, ...] = ()  # targets not waited for (``await_only``), still silent
    if await_only is not None:
        unheard = tuple(i for i in targets if i not in tally.votes)
    late = tuple(sorted(silent(tally) + _not_sent(tally) + refused + unheard))
    if late:
        yield from repeat_release(plan, late, args)
    return tally


def repeat_release(
    plan: LockPlan, targets: tuple[int, ...], args: tuple[str | int, ...]
) -> Flow[None]:
    """Hand the release (``args``: see :func:`release_args`) on ``targets`` to the background,
    sent again once each answers until the lease's TTL is over (:class:`~.effects.Repeat`).
    Nothing for a token that is granted again (``plan.tokens_reused``): a repeat landing after
    its next grant would delete that."""
    if not plan.tokens_reused:
        yield Repeat(
            plan.wiring.release, targets, plan.release_keys, args, until_s=plan.ttl_ms / 1000.0
        )


def release_args(
    plan: LockPlan, token: str, *, waiter: str = "-", next_token: str = "", grant: str = ""
) -> tuple[str | int, ...]:
    """The release script's arguments (see :func:`release_round`)."""
    args = (token, plan.handoff_ms, plan.wake_ms, next_token, plan.ttl_ms, waiter,
            plan.fence_retention_ms)  # fmt: skip
    return (*args, grant) if grant else args


def _not_sent(tally: Tally) -> tuple[int, ...]:
    return tuple(
        index
        for index, (outcome, detail) in sorted(tally.votes.items())
        if outcome is Outcome.ERROR and isinstance(detail, NotSent)
    )


@dataclass(frozen=True, slots=True)
class ReleaseVerdict:
    """``error`` is what ``release()`` raises (None: released on a majority)."""

    error: LockLost | Unavailable | None


def release(
    plan: LockPlan,
    token: str,
    *,
    expired: bool,
    waiter: str = "-",
    new_token: Callable[[], str] | None = None,
    grant: str = "",
) -> Flow[ReleaseVerdict]:
    """Release a lease; ``expired``: its local deadline had passed or it was known lost;
    ``new_token``: where the plan hands over, the source of the next holder's token;
    ``waiter``: the lease's waiter id (set when it was claimed from a hand-over);
    ``grant``: see :func:`release_round`.

    An exception thrown in while the round runs (its caller cancelled and then its task too,
    as when ``asyncio.run()`` ends with the release still going; a KeyboardInterrupt) hands
    the release to the background, as :func:`~.acquire.clean_up` does, and is raised after
    that: else the key would stay until its TTL."""
    next_token = offered_token(plan, new_token)
    try:
        tally = yield from release_round(
            plan, token, waiter=waiter, next_token=next_token, grant=grant
        )
    except GeneratorExit:
        raise
    except BaseException:
        # (simulation seed 7001075 --cancel --fork: a release cancelled during a delay spike,
        # its shielded round cancelled again as the job's loop closed: 4 of 5 servers kept
        # the key until its TTL)
        args = release_args(plan, token, waiter=waiter, next_token=next_token, grant=grant)
        yield from repeat_release(plan, plan.everyone, args)
        raise
    if tally.won:
        return ReleaseVerdict(None)
    text = summary(plan.key, tally)
    # an expired lease's release is LockLost whatever the servers said, but for a token that
    # is granted again (``plan.tokens_reused``) one that a server did not answer may still
    # land there after the token's next grant: its caller must hear that (Unavailable)
    if lost_for_sure(tally) or (expired and not plan.tokens_reused):
        return ReleaseVerdict(
            LockLost(plan.key, f"{text}: the lease had already expired or been taken")
        )
    return ReleaseVerdict(
        Unavailable(
            plan.key, f"{text}: {outage(tally, 'release not confirmed')}", votes(tally, plan.names)
        )
    )
