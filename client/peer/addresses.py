"""User-given multiaddrs, checked with py-multiaddr before hivemind sees them (it wants plain strings)."""
from __future__ import annotations

from collections.abc import Iterable

from multiaddr import Multiaddr

from hetswarm.protocol.errors import HetswarmError

ANY_HOST = "/ip4/0.0.0.0/tcp/0"
"""Listen on every interface, any free port: a volunteer's default."""
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
"""Listen on this machine only: monitors, the demo and the tests."""


class BadMultiaddr(HetswarmError):
    """A multiaddr that does not parse or lacks a part it needs."""


def check_maddrs(maddrs: Iterable[str], *, option: str, need_peer_id: bool = False) -> list[str]:
    """The multiaddrs as strings, or BadMultiaddr naming the offending one and the form expected."""
    checked = []
    for text in maddrs:
        try:
            maddr = Multiaddr(text)
            if need_peer_id:
                maddr.value_for_protocol("p2p")
        except Exception as e:
            form = "/ip4/HOST/tcp/PORT/p2p/PEER_ID" if need_peer_id else "/ip4/HOST/tcp/PORT"
            raise BadMultiaddr(f"{option}: {text!r} is not a valid multiaddr ({e}); expected {form}") from None
        checked.append(str(maddr))
    return checked
