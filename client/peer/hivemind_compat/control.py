"""hivemind 1.1.12's p2pd control client: a repair every hetswarm process installs before its P2P starts, and a dial.

`ControlClient` keeps one future per call it sends over its persistent connection to p2pd (unary calls, handler
registrations), and one task reads the daemon's answers and settles them. A caller that is cancelled — a timeout
(`stub.rpc_*(..., timeout=...)`, `asyncio.timeout`), an aborted training attempt, a plan switch — cancels its future
at once but drops it from the pending calls only when it runs again; an answer read in between is set on the
cancelled future, `InvalidStateError` ends the reading task, and from then on this process's unary calls and the
unary calls it serves all wait for ever (docs/hivemind.md, pitfall 17). `settle_late_answers` makes the reader leave
a settled future alone, as an answer to a call nobody waits for any more should be.

`dial` opens a connection to a peer at given addresses without opening a stream: the reachability check and
`hetswarm doctor` need to know whether an address answers, and hivemind's P2P exposes that only through its daemon
client (`P2P._client.connect`, which hivemind's own `is_identity_taken` uses the same way).
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Generator
from typing import Any

from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.control import ControlClient, P2PDaemonError
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure
from hivemind.utils.multiaddr import Multiaddr

__all__ = ["ControlFailure", "P2PDaemonError", "dial", "settle_late_answers"]


class _Settle:
    """A pending call's future as the reader sees it: an answer to a call already settled (cancelled) is dropped."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future) -> None:
        self.future = future

    def set_result(self, result: Any) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def set_exception(self, exception: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exception)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.future.__await__()


class _PendingCalls(dict):
    """`ControlClient._pending_calls` whose entries are read as `_Settle`s; stored and removed as plain futures."""

    def __getitem__(self, call_id: Any) -> _Settle:
        return _Settle(super().__getitem__(call_id))


def settle_late_answers() -> None:
    """Installs the repair (module docstring) in every ControlClient made from now on, in this process and in the
    processes it forks; idempotent."""
    init = ControlClient.__init__
    if getattr(init, "settles_late_answers", False):
        return

    @functools.wraps(init)
    def repaired(self: ControlClient, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._pending_calls = _PendingCalls(self._pending_calls)

    repaired.settles_late_answers = True
    ControlClient.__init__ = repaired


async def dial(p2p: P2P, peer: PeerID, maddrs: list[Multiaddr]) -> None:
    """Connects `p2p`'s daemon to `peer` at `maddrs`; raises ControlFailure with p2pd's reason when no address
    answers (module docstring). Bound it with a deadline: p2pd's own is long."""
    await p2p._client.connect(peer, maddrs)
