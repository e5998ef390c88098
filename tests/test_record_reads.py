"""One search of the DHT for several of a swarm's keys (protocol/record_store.py: SwarmRecords.read_many) reads what
a read of each key reads, on two real DHT nodes."""
from __future__ import annotations

import asyncio

import pytest
from hivemind.utils import get_dht_time

from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, MEASURE_FIELD, PEERS_FIELD, PROGRESS_FIELD
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import LinkRequests
from tests.helpers.dht_nodes import dht_pair
from tests.helpers.swarm_records import make_record
from tests.helpers.tiny_training import assignment_for

SWARM = "reads"
pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def test_one_search_for_several_keys_reads_what_a_read_of_each_key_does(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((first, coordinator_key), (second, other_key)):
        coordinator, other = peer_id_of(coordinator_key.get_public_key()), peer_id_of(other_key.get_public_key())
        ours, theirs = (SwarmRecords(first, SWARM, private_key=coordinator_key),
                        SwarmRecords(second, SWARM, private_key=other_key))

        async def publish_then_read():
            for store, record in ((ours, assignment_for([[coordinator, other]], coordinator)),
                                  (theirs, assignment_for([[other, coordinator]], other)),
                                  (ours, LinkRequests(coordinator_id=coordinator, pairs=[(coordinator, other)],
                                                      updated_at=get_dht_time())),
                                  (theirs, make_record(other))):
                assert await store.publish(record, ttl_s=60.0)
            fields = (ASSIGNMENT_FIELD, MEASURE_FIELD, PEERS_FIELD, PROGRESS_FIELD)
            return (await theirs.read_many(fields, prefer=(coordinator,)),
                    {field: await theirs.read(field, prefer=(coordinator,)) for field in fields})

        together, one_by_one = asyncio.run(publish_then_read())
    assert together == one_by_one
    assert set(together[ASSIGNMENT_FIELD]) == {coordinator, other}
    assert together[MEASURE_FIELD][coordinator].pairs == [(coordinator, other)]
    assert set(together[PEERS_FIELD]) == {other}
    assert together[PROGRESS_FIELD] == {}  # a key nobody stored
