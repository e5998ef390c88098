"""Starts real hivemind DHT nodes (each a forked process with its own p2pd) on 127.0.0.1 for tests."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import hivemind
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.peer.node import Identity, NodeConfig, start_dht
from hetswarm.protocol.keys import PEERS_FIELD, dht_key
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import PeerRecord


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



async def peers_seen_by(dht: hivemind.DHT, swarm: str) -> dict[str, PeerRecord]:
    return await SwarmRecords(dht, swarm).read(PEERS_FIELD)


async def store_raw(dht: hivemind.DHT, swarm: str, value, subkey: bytes) -> bool:
    """Bypasses encode_record, as a modified client would."""
    return await dht.store(dht_key(swarm, PEERS_FIELD), value, get_dht_time() + 30, subkey=subkey, return_future=True)
