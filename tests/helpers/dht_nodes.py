"""Starts real hivemind DHT nodes (each a forked process with its own p2pd) on 127.0.0.1 for tests."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import hivemind
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.node import Identity, NodeConfig, start_dht
from hetswarm.protocol.identity import load_identity


def start_node(
    swarm: str, identity_path: Path, initial_peers: list[str] = (), *, signing_key: RSAPrivateKey | None = None
) -> tuple[hivemind.DHT, RSAPrivateKey]:
    """A node as the product starts one; `signing_key` other than the identity's makes an impostor."""
    key = signing_key or load_identity(identity_path)
    config = NodeConfig(swarm=swarm, initial_peers=tuple(initial_peers), host_maddrs=(LOOPBACK,))
    return start_dht(config, Identity(identity_path, key)), key


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

