"""Send one script to several servers at once and tally the replies as they arrive.

One thread does it all: the command is written to every server first, then the replies are
read in the order they become readable (``selectors``), so a round costs about one round trip
plus the client's per-command CPU, and a slow server delays nobody. When the round is decided
early, the connections still waiting for a reply are parked on their node and drained later.
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._core.quorum import Outcome, Tally
from .._scripts import Script
from .node import Node

Classify = Callable[[object], tuple[Outcome, object]]


class Stragglers:
    """Servers of a decided round whose replies are still on the way.

    :meth:`park` leaves them to their nodes (drained at a later checkout); :meth:`settle` waits
    for them (to the round's deadline, recording their votes), so that a cleanup sent next cannot
    overtake their command on the server (the cleanup travels on another connection).
    """

    def __init__(
        self, selector: Any, tally: Tally, nodes: Sequence[Node], call: _Call, deadline: float
    ) -> None:
        self._selector = selector
        self._tally = tally
        self._nodes = nodes
        self._call = call
        self._deadline = deadline

    def park(self) -> None:
        for key in list(self._selector.get_map().values()):
            index, conn = key.data
            self._nodes[index].park(conn)
        self._selector.close()

    def settle(self) -> None:
        try:
            _collect(self._selector, self._tally, self._nodes, self._call, self._deadline, None)
        finally:
            self._selector.close()


class _Call:
    def __init__(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[str | int],
        classify: Classify,
        budget_s: float,
    ) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.classify = classify
        self.budget_s = budget_s


def fan_out(
    tally: Tally,
    nodes: Sequence[Node],
    targets: Sequence[int],
    script: Script,
    keys: Sequence[str],
    args: Sequence[str | int],
    classify: Classify,
    *,
    budget_s: float,
    stop: Callable[[Tally], bool] | None = None,
    keep_stragglers: bool = False,
) -> Stragglers | None:
    """Run ``script`` on every target server, recording each vote in ``tally``.

    Returns as soon as ``stop(tally)`` is true, when every target answered, or when
    ``budget_s`` ran out (silent targets are recorded as ``TimeoutError`` votes). Every failure
    is a vote, never an exception. One target is called inline. Servers still owing a reply
    after an early stop are parked on their nodes, or returned as :class:`Stragglers` with
    ``keep_stragglers``.
    """
    if len(targets) == 1:
        index = targets[0]
        try:
            result: object = nodes[index].run(script, keys, args)
        except Exception as exc:
            result = exc
        tally.record(index, *classify(result))
        return None
    call = _Call(script, keys, args, classify, budget_s)
    selector = selectors.DefaultSelector()
    try:
        for index in targets:
            node = nodes[index]
            conn = None
            try:
                conn = node.checkout()
                node.send(conn, script, keys, args)
                selector.register(conn._sock, selectors.EVENT_READ, (index, conn))
            except Exception as exc:
                if conn is not None:
                    node.discard(conn)
                tally.record(index, *classify(exc))
        deadline = time.monotonic() + budget_s
        _collect(selector, tally, nodes, call, deadline, stop)
    except BaseException:
        Stragglers(selector, tally, nodes, call, 0.0).park()
        raise
    stragglers = Stragglers(selector, tally, nodes, call, deadline)
    if keep_stragglers and selector.get_map():
        return stragglers
    stragglers.park()
    return None


def _collect(
    selector: Any,
    tally: Tally,
    nodes: Sequence[Node],
    call: _Call,
    deadline: float,
    stop: Callable[[Tally], bool] | None,
) -> None:
    while selector.get_map() and not (stop is not None and stop(tally)):
        events = selector.select(max(0.0, deadline - time.monotonic()))
        if not events:
            _time_out(selector, tally, nodes, call.budget_s)
            return
        for key, _ in events:
            index, conn = key.data
            selector.unregister(key.fileobj)
            node = nodes[index]
            try:
                result: object = node.receive(conn, call.script, call.keys, call.args)
            except Exception as exc:
                node.discard(conn)
                result = exc
            else:
                node.checkin(conn)
            tally.record(index, *call.classify(result))


def _time_out(selector: Any, tally: Tally, nodes: Sequence[Node], budget_s: float) -> None:
    for key in list(selector.get_map().values()):
        index, conn = key.data
        selector.unregister(key.fileobj)
        nodes[index].discard(conn)
        tally.record(index, Outcome.ERROR, TimeoutError(f"no answer within {budget_s:.3f} s"))
