"""A node's DHT process survives values up to the record limit, stored over and over (client/peer/node.py,
WholeMessagePipe): before the fix, one ~32 KB record killed the publishing node about one time in four."""
from __future__ import annotations

import asyncio
import os

import pytest
from hivemind.utils import MSGPackSerializer, get_dht_time

from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PEERS_FIELD, dht_key
from hetswarm.protocol.limits import MAX_LINKS_PER_RECORD, MAX_RECORD_BYTES
from hetswarm.protocol.record_store import SwarmRecords, encode_record
from hetswarm.protocol.records import LinkMeasurement, PeerRecord
from tests.helpers.dht_nodes import dht_pair
from tests.helpers.swarm_records import make_record

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(180)]
SWARM = "bigvalues"
STORES = 30
BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def largest_record(peer_id: str) -> PeerRecord:
    """A valid PeerRecord as large as the schema lets one be: every link, every address, the longest names."""
    links = {peer_id_of_index(i): LinkMeasurement(latency_ms=123.456789, bandwidth_mbps=9876.54321,
                                                  measured_at=get_dht_time(), samples=1000)
             for i in range(MAX_LINKS_PER_RECORD)}
    return make_record(peer_id, name="n" * 64).copy(update={
        "links": links, "maddrs": [f"/dns4/{'h' * 230}.example/tcp/31337" for _ in range(16)]})


def peer_id_of_index(i: int) -> str:
    """A distinct well-formed peer id per index (base58 digits of i, padded)."""
    digits = ""
    while True:
        i, digit = divmod(i, 58)
        digits += BASE58[digit]
        if i == 0:
            return "Qm" + digits.ljust(44, "z")


def test_the_largest_valid_record_is_published_and_read_back_every_time(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((first, _), (second, key)):
        record = largest_record(peer_id_of(key.get_public_key()))
        size = len(MSGPackSerializer.dumps(encode_record(record)))

        async def scenario() -> None:
            publisher = SwarmRecords(second, SWARM, private_key=key)
            for attempt in range(STORES):
                assert await publisher.publish(record, ttl_s=30), f"store {attempt} of a {size}-byte record failed"
                assert (await SwarmRecords(first, SWARM).peers()).get(record.peer_id) == record

        asyncio.run(scenario())
        assert size > 30_000 and first.is_alive() and second.is_alive()


def test_values_at_the_byte_limit_leave_the_node_serving(tmp_path):
    """Raw values just under MAX_RECORD_BYTES (refused by the schema, but they cross the same pipe first)."""
    with dht_pair(SWARM, tmp_path) as ((first, _), (second, key)):
        record = make_record(peer_id_of(key.get_public_key()))

        async def scenario() -> None:
            publisher = SwarmRecords(second, SWARM, private_key=key)
            for attempt in range(STORES):
                value = os.urandom(MAX_RECORD_BYTES - 64 - attempt)
                async with asyncio.timeout(10):
                    await second.store(dht_key(SWARM, PEERS_FIELD), value, get_dht_time() + 30, return_future=True)
                assert await publisher.publish(record, ttl_s=30), f"the node stopped serving after store {attempt}"
            assert (await SwarmRecords(first, SWARM).peers()).get(record.peer_id) == record

        asyncio.run(scenario())
        assert first.is_alive() and second.is_alive()
