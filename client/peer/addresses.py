"""User-given multiaddrs, checked with py-multiaddr before hivemind sees them (it wants plain strings); the default
listen addresses, and where the metrics are served."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from multiaddr import Multiaddr

from hetswarm.protocol.errors import ConfigError, HetswarmError

ANY_HOST = "/ip4/0.0.0.0/tcp/0"
"""Listen on every interface, any free port: a volunteer's default."""
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
"""Listen on this machine only: monitors, the demo and the tests."""
DEFAULT_METRICS_HOST = "127.0.0.1"
"""Loopback unless told otherwise: the metrics name peers and their links, and prometheus_client's server has no
authentication, so a volunteer's machine should not offer them to the internet by default. A Prometheus on the
same host, or an SSH tunnel, reaches them; `--metrics-host 0.0.0.0` widens it where a firewall already decides."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsAddress:
    """--metrics-host HOST --metrics-port PORT; port 0 picks a free port (the log line names it)."""

    port: int
    host: str = DEFAULT_METRICS_HOST

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--metrics-port must be between 0 and 65535, got {self.port}")
        if not self.host:
            raise ConfigError("--metrics-host must name an address to bind, e.g. 127.0.0.1 or 0.0.0.0")


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
