"""Publishing and reading a swarm's signed records: one subkey per owner under each of the swarm's keys."""
from __future__ import annotations

import logging
from typing import TypeVar

import pydantic.v1 as pydantic
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import MSGPackSerializer, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.protocol.errors import RecordTooLarge
from hetswarm.protocol.keys import dht_key
from hetswarm.protocol.limits import MAX_RECORD_BYTES
from hetswarm.protocol.signing import owner_peer_id

logger = logging.getLogger(__name__)

R = TypeVar("R", bound=pydantic.BaseModel)

SIGNATURE_BYTES = 400
"""Room left for the `[signature:...]` suffix (a base64 RSA-2048 PSS signature is 344 bytes)."""


def owner_subkey(private_key: RSAPrivateKey) -> bytes:
    """The subkey that makes a record ours: RSASignatureValidator signs only subkeys holding our owner marker."""
    public_key = private_key.get_public_key().to_bytes()
    return RSASignatureValidator.PUBLIC_KEY_FORMAT.replace(b"_key_", public_key)


def encode_record(record: pydantic.BaseModel) -> dict:
    """The msgpack-ready value of a record, refused here with a clear error if it would be too large to store."""
    value = record.dict()
    size = len(MSGPackSerializer.dumps(value)) + SIGNATURE_BYTES
    if size > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"{type(record).__name__} of ~{size} bytes exceeds the {MAX_RECORD_BYTES}-byte DHT record limit"
        )
    return value


async def publish(
    dht: DHT, swarm: str, field: str, record: pydantic.BaseModel, *, private_key: RSAPrivateKey, ttl_s: float
) -> bool:
    """Stores our record under the swarm's `field` key for `ttl_s` seconds; True if at least one node took it."""
    value = encode_record(record)
    return await dht.store(
        dht_key(swarm, field),
        value,
        expiration_time=get_dht_time() + ttl_s,
        subkey=owner_subkey(private_key),
        return_future=True,
    )


async def read_records(dht: DHT, swarm: str, field: str, schema: type[R]) -> dict[str, R]:
    """Every valid record under the swarm's `field` key, by the peer id of its signer."""
    found = await dht.get(dht_key(swarm, field), latest=True, return_future=True)
    if found is None or not isinstance(found.value, dict):
        return {}
    records = {}
    for subkey, item in found.value.items():
        owner = owner_peer_id(subkey) if isinstance(subkey, bytes) else None
        try:
            records[owner] = schema.parse_obj(item.value)
        except pydantic.ValidationError as e:
            logger.warning(f"Skipped a malformed {field!r} record from {owner}: {e}")
    records.pop(None, None)
    return records
