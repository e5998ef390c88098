"""The validators' memory of passed records (protocol/signing.py, PassedRecords): an unchanged record is checked
once, anything else as before."""
from __future__ import annotations

import dataclasses

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PEERS_FIELD, dht_key
from hetswarm.protocol.record_store import owner_subkey
from hetswarm.protocol.signing import PassedRecords, make_validators
from tests.helpers.swarm_records import make_record

SWARM = "passed"


class Counting(RecordValidatorBase):
    """Passes (or refuses) every record, counting the records it was asked about."""

    def __init__(self, verdict: bool = True) -> None:
        self.verdict, self.calls = verdict, 0

    def validate(self, record: DHTRecord) -> bool:
        self.calls += 1
        return self.verdict


@pytest.fixture(scope="module")
def key() -> RSAPrivateKey:
    return RSAPrivateKey()


def signed_record(key: RSAPrivateKey, name: str = "honest") -> DHTRecord:
    """A peer record as its owner's node stores it: signed by the swarm's validators."""
    record = DHTRecord(DHTID.generate(source=dht_key(SWARM, PEERS_FIELD)).to_bytes(),
                       MSGPackSerializer.dumps(owner_subkey(key)),
                       MSGPackSerializer.dumps(make_record(peer_id_of(key.get_public_key()), name=name).dict()),
                       get_dht_time() + 30)
    return dataclasses.replace(record, value=CompositeValidator(make_validators(SWARM, key)).sign_value(record))


def test_an_unchanged_record_is_checked_once(key):
    counting = Counting()
    validator = PassedRecords([counting, *make_validators(SWARM, key)])
    record = signed_record(key)
    assert validator.validate(record) and validator.validate(dataclasses.replace(record))
    assert counting.calls == 1


def test_a_record_changed_after_it_passed_is_checked_and_refused(key):
    """The memory is of the whole record: the same value re-dated, or with a byte changed, is checked anew, and
    its signature no longer holds."""
    validator = CompositeValidator(make_validators(SWARM, key))
    record = signed_record(key)
    assert validator.validate(record)
    assert not validator.validate(dataclasses.replace(record, expiration_time=record.expiration_time + 1000))
    tampered = record.value.replace(b"honest", b"hOnest")
    assert tampered != record.value and not validator.validate(dataclasses.replace(record, value=tampered))
    assert validator.validate(record)


def test_a_refused_record_is_checked_every_time(key):
    counting = Counting(verdict=False)
    validator = PassedRecords([counting])
    record = signed_record(key)
    assert not validator.validate(record) and not validator.validate(record)
    assert counting.calls == 2


def test_the_memory_keeps_the_most_recently_passed(key):
    counting = Counting()
    validator = PassedRecords([counting], max_remembered=2)
    first, second, third = (signed_record(key, name) for name in ("one", "two", "three"))
    for record in (first, second, first, third):  # `first` used again: `second` is the oldest when `third` comes
        validator.validate(record)
    assert counting.calls == 3
    validator.validate(first)
    assert counting.calls == 3
    validator.validate(second)
    assert counting.calls == 4


def test_signing_and_stripping_are_the_chains(key):
    """A node signs its own stores and strips what it reads through the same chain as before."""
    record = signed_record(key)
    plain = MSGPackSerializer.loads(CompositeValidator(make_validators(SWARM, key)).strip_value(record))
    assert plain["public_name"] == "honest"
