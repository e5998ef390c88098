"""The record validators every node of a swarm installs, so that every replica refuses the same bad records.

Order matters: hivemind runs validators by decreasing priority. The size check sees the raw value first, the
RSA signature check (priority 10) strips the signature, the owner binding sees the signed payload, and the
schema check (priority 0) parses it last.
"""
from __future__ import annotations

import logging

import pydantic.v1 as pydantic
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD, PROGRESS_FIELD, dht_key
from hetswarm.protocol.limits import MAX_RECORD_BYTES
from hetswarm.protocol.records import Assignment, PeerRecord, Progress

logger = logging.getLogger(__name__)

OWNER_FIELDS = {PEERS_FIELD: "peer_id", ASSIGNMENT_FIELD: "coordinator_id", PROGRESS_FIELD: "peer_id"}
"""For each record kind, the field that names its owner; it must be the peer id of the signing key."""


class SwarmSchema(pydantic.BaseModel):
    """One field per DHT key of a swarm; each value is a dictionary of signed subkeys, one per owner."""

    peers: dict[BytesWithPublicKey, PeerRecord]
    assignment: dict[BytesWithPublicKey, Assignment]
    progress: dict[BytesWithPublicKey, Progress]


def owner_peer_id(subkey: bytes) -> str | None:
    """The peer id whose key is in a subkey's `[owner:...]` marker, or None if there is not exactly one."""
    keys = set(RSASignatureValidator._PUBLIC_KEY_RE.findall(subkey))
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


class OwnerBindingValidator(RecordValidatorBase):
    """Binds each signed subkey to the peer id its record claims, so no peer can speak for another."""

    def __init__(self, swarm: str):
        self._fields = {DHTID.generate(source=dht_key(swarm, f)).to_bytes(): f for f in OWNER_FIELDS}

    def validate(self, record: DHTRecord) -> bool:
        field = self._fields.get(record.key)
        if field is None:
            return True  # not a hetswarm key; the schema validator decides
        if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
            logger.warning(f"Refused a plain value under the {field!r} key: only signed subkeys are allowed")
            return False
        try:
            subkey, value = MSGPackSerializer.loads(record.subkey), MSGPackSerializer.loads(record.value)
        except Exception:
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

    def merge_with(self, other: RecordValidatorBase) -> bool:
        if not isinstance(other, OwnerBindingValidator):
            return False
        self._fields.update(other._fields)
        return True


def make_validators(swarm: str, private_key: RSAPrivateKey) -> list[RecordValidatorBase]:
    """The validators for one swarm; every DHT node of the swarm must be started with these."""
    return [
        RecordSizeValidator(),
        RSASignatureValidator(private_key),
        OwnerBindingValidator(swarm),
        SchemaValidator(SwarmSchema, allow_extra_keys=False, prefix=swarm),
    ]
