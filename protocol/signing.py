"""The record validators every node of a swarm installs, so that every replica refuses the same bad records.

Order matters: hivemind runs validators by decreasing priority. The size check sees the raw value first, the
RSA signature check (priority 10) strips the signature, the owner binding and the lifetime check see the signed
payload, and the schema check (priority 0) parses it last, with the physical bounds of protocol/records.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable

import pydantic.v1 as pydantic
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import CompositeValidator, DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, MEASURE_FIELD, PEERS_FIELD, PROGRESS_FIELD, REFUSED_FIELD, dht_key
from hetswarm.protocol.limits import MAX_CLOCK_SKEW_S, MAX_RECORD_BYTES, MAX_RECORD_TTL_S
from hetswarm.protocol.records import Assignment, LinkRequests, PeerRecord, Progress, Refusals

logger = logging.getLogger(__name__)

OWNER_FIELDS = {PEERS_FIELD: "peer_id", ASSIGNMENT_FIELD: "coordinator_id", PROGRESS_FIELD: "peer_id",
                REFUSED_FIELD: "coordinator_id", MEASURE_FIELD: "coordinator_id"}
"""For each record kind, the field that names its owner; it must be the peer id of the signing key."""
TIMESTAMP_FIELDS = {PEERS_FIELD: "updated_at", ASSIGNMENT_FIELD: "issued_at", PROGRESS_FIELD: "updated_at",
                    REFUSED_FIELD: "updated_at", MEASURE_FIELD: "updated_at"}
REPUBLISHED = {ASSIGNMENT_FIELD}
"""Record kinds stored again unchanged, so their timestamp may be older than one lifetime (a plan in force)."""
MAX_REMEMBERED_RECORDS = 8192
"""Digests of passed records a node keeps (least recently used out first; about two megabytes): more than the records
of all five swarm keys at their cap (MAX_RECORDS_PER_KEY)."""


class SwarmSchema(pydantic.BaseModel):
    """One field per DHT key of a swarm; each value is a dictionary of signed subkeys, one per owner."""

    peers: dict[BytesWithPublicKey, PeerRecord]
    assignment: dict[BytesWithPublicKey, Assignment]
    progress: dict[BytesWithPublicKey, Progress]
    refused: dict[BytesWithPublicKey, Refusals]
    measure: dict[BytesWithPublicKey, LinkRequests]


_OWNER_MARKER = re.compile(RSASignatureValidator.PUBLIC_KEY_REGEX)


def owner_peer_id(subkey: bytes) -> str | None:
    """The peer id whose key is in a subkey's `[owner:...]` marker, or None if there is not exactly one."""
    keys = set(_OWNER_MARKER.findall(subkey))
    if len(keys) != 1:
        return None
    try:
        return peer_id_of(RSAPublicKey.from_bytes(keys.pop()))
    except ValueError:
        return None


class RecordSizeValidator(RecordValidatorBase):
    """Refuses values over MAX_RECORD_BYTES before anything parses them."""

    def validate(self, record: DHTRecord) -> bool:
        if len(record.value) > MAX_RECORD_BYTES:
            logger.warning(f"Refused a DHT record of {len(record.value)} bytes (limit {MAX_RECORD_BYTES})")
            return False
        return True

    @property
    def priority(self) -> int:
        return 20


class _SwarmKeyValidator(RecordValidatorBase):
    """A validator of a swarm's own keys (any other key passes it: the schema validator decides)."""

    def __init__(self, swarm: str):
        self._fields = {DHTID.generate(source=dht_key(swarm, f)).to_bytes(): f for f in OWNER_FIELDS}

    def merge_with(self, other: RecordValidatorBase) -> bool:
        if type(other) is not type(self):
            return False
        self._fields.update(other._fields)
        return True

    def _payload(self, record: DHTRecord) -> tuple[str, bytes | None, object] | None:
        """(field, subkey, value) decoded, or None for another key; the value is None when it does not decode."""
        field = self._fields.get(record.key)
        if field is None:
            return None
        try:
            return field, MSGPackSerializer.loads(record.subkey), MSGPackSerializer.loads(record.value)
        except Exception:
            return field, None, None


class OwnerBindingValidator(_SwarmKeyValidator):
    """Binds each signed subkey to the peer id its record claims, so no peer can speak for another."""

    def validate(self, record: DHTRecord) -> bool:
        if (decoded := self._payload(record)) is None:
            return True
        field, subkey, value = decoded
        if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
            logger.warning(f"Refused a plain value under the {field!r} key: only signed subkeys are allowed")
            return False
        if value is None:
            logger.warning(f"Refused an undecodable {field!r} record")
            return False
        claimed = value.get(OWNER_FIELDS[field]) if isinstance(value, dict) else None
        signer = owner_peer_id(subkey) if isinstance(subkey, bytes) else None
        if signer is None or signer != claimed:
            logger.warning(f"Refused a {field!r} record claiming {claimed!r} but signed by {signer!r}")
            return False
        return True

    @property
    def priority(self) -> int:
        return 5


class LifetimeValidator(_SwarmKeyValidator):
    """Caps a record's life: the publisher chooses its expiration, so without a cap one record could stay for ever.

    A record may expire at most MAX_RECORD_TTL_S from now, and its own timestamp may be neither in the future nor
    (but for plans, which are stored again unchanged) older than one lifetime before its expiration. Both checks
    only get easier to pass as time goes on, so a record accepted once is accepted on every later read."""

    def validate(self, record: DHTRecord) -> bool:
        if (decoded := self._payload(record)) is None:
            return True
        field, _, value = decoded
        now = get_dht_time()
        stamp = value.get(TIMESTAMP_FIELDS[field]) if isinstance(value, dict) else None
        if record.expiration_time > now + MAX_RECORD_TTL_S + MAX_CLOCK_SKEW_S:
            why = f"expires in {record.expiration_time - now:.0f} s (limit {MAX_RECORD_TTL_S:.0f} s)"
        elif not isinstance(stamp, float):
            return True  # the schema refuses it with a clearer reason
        elif stamp > now + MAX_CLOCK_SKEW_S:
            why = f"is dated {stamp - now:.0f} s in the future"
        elif field not in REPUBLISHED and stamp < record.expiration_time - MAX_RECORD_TTL_S - MAX_CLOCK_SKEW_S:
            why = f"lives {record.expiration_time - stamp:.0f} s past its date (limit {MAX_RECORD_TTL_S:.0f} s)"
        else:
            return True
        owner = value.get(OWNER_FIELDS[field]) if isinstance(value, dict) else None
        logger.warning(f"Refused a {field!r} record of {owner!r}: it {why}")
        return False

    @property
    def priority(self) -> int:
        return 4


class PassedRecords(RecordValidatorBase):
    """The swarm's validators behind a memory of the records they passed, so an unchanged record is checked once.

    A read of a swarm key visits every node of the key's beam (`latest=True`, protocol/record_store.py) and each
    answers with its copy of every record under the key, checked again on arrival; between two heartbeats a node
    thus checked the same records many times over (signature, owner, lifetime, schema: 16 standing-by clients' DHT
    processes took 143 % of a core, 25 % with this memory; benchmarks/standby_swarm.py). A verdict of these
    validators depends on the record's four fields alone (the signature covers all of them), and the only check that
    depends on the time, LifetimeValidator's, only gets easier to pass; so a record that passed once passes again,
    and is remembered by a 256-bit digest of its fields. Refusals are not remembered: a record dated just ahead of
    this clock passes later."""

    def __init__(self, validators: Iterable[RecordValidatorBase], max_remembered: int = MAX_REMEMBERED_RECORDS):
        self._chain = CompositeValidator(validators)
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._max_remembered = max_remembered

    def validate(self, record: DHTRecord) -> bool:
        if len(record.value) > MAX_RECORD_BYTES:  # the chain's size check refuses it, before anything reads it whole
            return self._chain.validate(record)
        digest = hashlib.blake2b(MSGPackSerializer.dumps(dataclasses.astuple(record)), digest_size=32).digest()
        if digest in self._passed:
            self._passed.move_to_end(digest)
            return True
        if not self._chain.validate(record):
            return False
        self._passed[digest] = None
        if len(self._passed) > self._max_remembered:
            self._passed.popitem(last=False)
        return True

    def sign_value(self, record: DHTRecord) -> bytes:
        return self._chain.sign_value(record)

    def strip_value(self, record: DHTRecord) -> bytes:
        return self._chain.strip_value(record)

    @property
    def priority(self) -> int:
        return RecordSizeValidator().priority  # the first to see a raw value, as the chain's own first check


def make_validators(swarm: str, private_key: RSAPrivateKey) -> list[RecordValidatorBase]:
    """The validators for one swarm; every DHT node of the swarm must be started with these."""
    return [PassedRecords([
        RecordSizeValidator(),
        RSASignatureValidator(private_key),
        OwnerBindingValidator(swarm),
        LifetimeValidator(swarm),
        SchemaValidator(SwarmSchema, allow_extra_keys=False, prefix=swarm),
    ])]
