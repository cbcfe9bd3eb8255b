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
) -> None:
    """Run ``script`` on every target server, recording each vote in ``tally``.

    Returns as soon as ``stop(tally)`` is true, when every target answered, or when
    ``budget_s`` ran out (silent targets are recorded as ``TimeoutError`` votes). Every failure
    is a vote, never an exception. One target is called inline.
    """
    if len(targets) == 1:
        index = targets[0]
        try:
            result: object = nodes[index].run(script, keys, args)
        except Exception as exc:
            result = exc
        tally.record(index, *classify(result))
        return
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
        while selector.get_map() and not (stop is not None and stop(tally)):
            events = selector.select(max(0.0, deadline - time.monotonic()))
            if not events:
                _time_out(selector, tally, nodes, budget_s)
                break
            for key, _ in events:
                index, conn = key.data
                selector.unregister(key.fileobj)
                node = nodes[index]
                try:
                    result = node.receive(conn, script, keys, args)
                except Exception as exc:
                    node.discard(conn)
                    result = exc
                else:
                    node.checkin(conn)
                tally.record(index, *classify(result))
        for key in list(selector.get_map().values()):
            index, conn = key.data
            nodes[index].park(conn)
    finally:
        selector.close()


def _time_out(selector: Any, tally: Tally, nodes: Sequence[Node], budget_s: float) -> None:
    for key in list(selector.get_map().values()):
        index, conn = key.data
        selector.unregister(key.fileobj)
        nodes[index].discard(conn)
        tally.record(index, Outcome.ERROR, TimeoutError(f"no answer within {budget_s:.3f} s"))
