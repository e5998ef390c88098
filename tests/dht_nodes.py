"""Starts real hivemind DHT nodes (each a forked process with its own p2pd) on 127.0.0.1 for tests."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import hivemind
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.protocol.identity import load_identity
from hetswarm.protocol.signing import make_validators

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def start_node(
    swarm: str, identity_path: Path, initial_peers: list[str] = (), **kwargs
) -> tuple[hivemind.DHT, RSAPrivateKey]:
    key = load_identity(identity_path)
    dht = hivemind.DHT(
        initial_peers=list(initial_peers),
        host_maddrs=LOOPBACK,
        identity_path=str(identity_path),
        record_validators=make_validators(swarm, key),
        start=False,
        **kwargs,
    )
    dht.run_in_background(await_ready=True, timeout=60)
    return dht, key


@contextlib.contextmanager
def dht_pair(swarm: str, tmp_path: Path) -> Iterator[tuple[tuple[hivemind.DHT, RSAPrivateKey], ...]]:
    """Two connected nodes of one swarm, shut down on exit."""
    first = start_node(swarm, tmp_path / "a.key")
    maddrs = [str(m) for m in first[0].get_visible_maddrs()]
    second = start_node(swarm, tmp_path / "b.key", maddrs)
    try:
        yield first, second
    finally:
        second[0].shutdown()
        first[0].shutdown()


def run(coro):
    return asyncio.run(coro)
