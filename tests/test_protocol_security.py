"""Record security on real DHT nodes: no peer can speak for another, and bad records are refused everywhere."""
from __future__ import annotations

import asyncio

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time

from hetswarm.protocol.errors import RecordTooLarge
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PEERS_FIELD, dht_key
from hetswarm.protocol.limits import MAX_RECORD_BYTES
from hetswarm.protocol.record_store import SwarmRecords, encode_record, owner_subkey
from hetswarm.protocol.signing import make_validators
from tests.helpers.dht_nodes import dht_pair, peers_seen_by, store_raw
from tests.helpers.swarm_records import make_record

SWARM = "sectest"
pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def test_records_of_both_peers_are_read_back_bound_to_their_signers(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((dht_a, key_a), (dht_b, key_b)):
        id_a, id_b = peer_id_of(key_a.get_public_key()), peer_id_of(key_b.get_public_key())

        async def scenario():
            assert await SwarmRecords(dht_a, SWARM, private_key=key_a).publish(make_record(id_a), ttl_s=30)
            assert await SwarmRecords(dht_b, SWARM, private_key=key_b).publish(make_record(id_b), ttl_s=30)
            return await peers_seen_by(dht_a, SWARM), await peers_seen_by(dht_b, SWARM)

        for seen in asyncio.run(scenario()):
            assert set(seen) == {id_a, id_b}
            assert all(owner == record.peer_id for owner, record in seen.items())


def test_a_peer_cannot_overwrite_another_peers_record(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((dht_a, key_a), (dht_b, key_b)):
        id_a = peer_id_of(key_a.get_public_key())

        async def scenario():
            assert await SwarmRecords(dht_a, SWARM, private_key=key_a).publish(make_record(id_a), ttl_s=30)
            forged = encode_record(make_record(id_a, name="forged", tflops=999.0))
            accepted = await store_raw(dht_b, SWARM, forged, owner_subkey(key_a))  # B cannot sign with A's key
            return accepted, await peers_seen_by(dht_a, SWARM), await peers_seen_by(dht_b, SWARM)

        accepted, seen_a, seen_b = asyncio.run(scenario())
        assert not accepted
        for seen in (seen_a, seen_b):
            assert seen[id_a].public_name == "honest" and seen[id_a].hardware.tflops == 1.0


def test_a_record_claiming_another_peer_id_is_refused(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((dht_a, key_a), (dht_b, key_b)):
        id_a = peer_id_of(key_a.get_public_key())

        async def scenario():
            impostor = encode_record(make_record(id_a, name="impostor"))
            accepted = await store_raw(dht_b, SWARM, impostor, owner_subkey(key_b))  # signed by B, claims to be A
            return accepted, await peers_seen_by(dht_a, SWARM)

        accepted, seen = asyncio.run(scenario())
        assert not accepted
        assert seen == {}


def test_a_schema_violation_is_refused(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((dht_a, key_a), (dht_b, key_b)):
        id_b = peer_id_of(key_b.get_public_key())

        async def scenario():
            bad = encode_record(make_record(id_b))
            bad["hardware"]["tflops"] = "very fast"
            wrong_type = await store_raw(dht_b, SWARM, bad, owner_subkey(key_b))
            extra = encode_record(make_record(id_b)) | {"admin": True}
            extra_field = await store_raw(dht_b, SWARM, extra, owner_subkey(key_b))
            return wrong_type, extra_field, await peers_seen_by(dht_a, SWARM)

        wrong_type, extra_field, seen = asyncio.run(scenario())
        assert not wrong_type and not extra_field
        assert seen == {}


def test_an_oversized_record_is_refused_before_sending_and_by_every_validator(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((dht_a, key_a), (dht_b, key_b)):
        id_b = peer_id_of(key_b.get_public_key())
        oversized = make_record(id_b).copy(update={"maddrs": ["m" * 256] * 200})
        with pytest.raises(RecordTooLarge, match=str(MAX_RECORD_BYTES)):
            asyncio.run(SwarmRecords(dht_b, SWARM, private_key=key_b).publish(oversized, ttl_s=30))

        # A modified client could skip that check; the validators every node runs refuse it too. (Sending such a
        # value through hivemind's DHT pipe risks crashing the sender's DHT process: docs/hivemind.md, pitfall 1.)
        raw = MSGPackSerializer.dumps(oversized.dict())
        record = DHTRecord(DHTID.generate(source=dht_key(SWARM, PEERS_FIELD)).to_bytes(), MSGPackSerializer.dumps(
            owner_subkey(key_b)), raw, get_dht_time() + 30)
        assert len(raw) > MAX_RECORD_BYTES
        assert not CompositeValidator(make_validators(SWARM, key_b)).validate(record)

        async def still_serving():
            stored = await SwarmRecords(dht_b, SWARM, private_key=key_b).publish(make_record(id_b), ttl_s=30)
            return stored, await peers_seen_by(dht_a, SWARM)

        stored, seen = asyncio.run(still_serving())
        assert stored and set(seen) == {id_b}
