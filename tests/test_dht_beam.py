"""Reads and stores of a swarm key visit DHT_BEAM_SIZE nodes, not hivemind's 20, and a volunteer's polls of the peer
records only VIEW_BEAM_SIZE (protocol/limits.py): on a DHT larger than the beam, every node still reads every peer's
record, by either read."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.limits import DHT_BEAM_SIZE, VIEW_BEAM_SIZE
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.remembered_peers import RememberedPeers
from tests.helpers.dht_nodes import peers_seen_by, start_node
from tests.helpers.swarm_records import make_record

SWARM = "beam"
NODES = DHT_BEAM_SIZE + 3
pytestmark = [pytest.mark.swarm, pytest.mark.timeout(240)]


def test_every_node_of_a_dht_larger_than_the_read_beam_reads_every_record(tmp_path):
    with contextlib.ExitStack() as stack:
        nodes = []
        for index in range(NODES):
            initial = [str(m) for m in nodes[0][0].get_visible_maddrs()] if nodes else []
            dht, key = start_node(SWARM, tmp_path / f"{index}.key", initial)
            stack.callback(dht.shutdown)
            nodes.append((dht, key))
        ids = {peer_id_of(key.get_public_key()) for _, key in nodes}

        async def publish_then_read():
            for dht, key in nodes:
                record = make_record(peer_id_of(key.get_public_key()))
                assert await SwarmRecords(dht, SWARM, private_key=key).publish(record, ttl_s=60)
            polls = [RememberedPeers().read(SwarmRecords(dht, SWARM), beam_size=VIEW_BEAM_SIZE) for dht, _ in nodes]
            return [(await peers_seen_by(dht, SWARM), await poll) for (dht, _), poll in zip(nodes, polls)]

        for index, (seen, polled) in enumerate(asyncio.run(publish_then_read())):
            assert set(seen) == ids, f"node {index} read {len(seen)} of {NODES} records"
            assert set(polled) == ids, f"node {index} polled {len(polled)} of {NODES} records"
