"""``fencelock elect``: run a command while elected leader (its term is the fence), as
``run`` runs one while holding a lock."""

from __future__ import annotations

import argparse
from typing import Any

from .. import (
    Client,
    LockLost,
    NotAcquired,
    Unavailable,
)
from .common import DEFAULT_SERVER, EX_LOST, EX_UNAVAILABLE, PROG, log, resolve_servers, say
from .run import (
    ACQUIRE_SLICE,
    PermanentFailure,
    RunState,
    Watcher,
    child_exit_code,
    run_child,
    supervised,
)

#: Term lease of ``fencelock elect`` unless ``--ttl`` says otherwise (seconds): a dead leader is
#: replaced within about this long.
DEFAULT_TERM_TTL = 10.0


# -- elect ----------------------------------------------------------------------------------------


def cmd_elect(args: argparse.Namespace) -> int:
    prog = f"{PROG} elect"
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    client = Client(servers, ttl=DEFAULT_TERM_TTL if args.ttl is None else args.ttl)
    election = client.election(args.key, name=args.name)  # ConfigError (64) before any I/O
    return supervised(
        lambda state: _lead(prog, election, args, state, Watcher(prog, servers, args.verbose)),
        client.close,
    )


def _lead(
    prog: str, election: Any, args: argparse.Namespace, state: RunState, watcher: Watcher
) -> int:
    """Campaign (in slices, so a queued signal is seen), then run the command as leader;
    permanent server errors that deny a majority end the campaign at once (exit 69)."""
    returncode: int | None = None
    while not state.pending:
        try:
            with election.campaign(wait=ACQUIRE_SLICE) as term:
                if state.pending:  # came with the term: hand it on at once
                    break
                say(prog, f"{args.name} leads {args.key!r}, term {term.fence}")
                env = {"FENCELOCK_LEADER": args.name}
                returncode = run_child(prog, term, args, state, env, renew=False)
                if returncode is None:
                    return int(args.start_failure)
        except (NotAcquired, Unavailable) as exc:
            log.debug("not leader yet: %s", exc)
            try:
                watcher.see(exc)
            except PermanentFailure as failure:
                say(prog, f"Unavailable: {failure}")
                return EX_UNAVAILABLE
            continue
        except LockLost as exc:
            status = f"exiting {EX_LOST}"
            if returncode is not None:
                status = f"command exit status {child_exit_code(returncode)}; {status}"
            if state.loss_told:  # the supervisor told the loss when it stopped the command
                say(prog, status)
            else:
                say(prog, f"leadership of {args.key!r} lost: {exc}; {status}")
            return EX_LOST
        return child_exit_code(returncode)
    return state.interrupted(prog)
