"""Publishing and reading a swarm's signed records: one subkey per owner under each of the swarm's keys."""
from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Collection

import pydantic.v1 as pydantic
from hivemind import DHT
from hivemind.dht import DHTNode
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import MSGPackSerializer, ValueWithExpiration, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.protocol.errors import ConfigError, RecordTooLarge
from hetswarm.protocol.keys import (
    ASSIGNMENT_FIELD,
    MEASURE_FIELD,
    PEERS_FIELD,
    PROGRESS_FIELD,
    REFUSED_FIELD,
    check_swarm_name,
    dht_key,
)
from hetswarm.protocol.limits import (
    DHT_BEAM_SIZE,
    DHT_TIMEOUT_S,
    MAX_RECORD_BYTES,
    MAX_RECORD_TTL_S,
    MAX_RECORDS_PER_KEY,
)
from hetswarm.protocol.records import Assignment, LinkRequests, PeerId, PeerRecord, Progress, Refusals
from hetswarm.protocol.signing import TIMESTAMP_FIELDS, owner_peer_id

logger = logging.getLogger(__name__)

SIGNATURE_BYTES = 400
"""Room left for the `[signature:...]` suffix (a base64 RSA-2048 PSS signature is 344 bytes)."""

SCHEMAS: dict[str, type[pydantic.BaseModel]] = {PEERS_FIELD: PeerRecord, ASSIGNMENT_FIELD: Assignment,
                                                PROGRESS_FIELD: Progress, REFUSED_FIELD: Refusals,
                                                MEASURE_FIELD: LinkRequests}
"""The schema of each of a swarm's keys; the validators install the same (signing.py)."""
FIELDS: dict[type[pydantic.BaseModel], str] = {schema: field for field, schema in SCHEMAS.items()}


def owner_subkey(private_key: RSAPrivateKey) -> bytes:
    """The subkey that makes a record ours: RSASignatureValidator signs only subkeys holding our owner marker."""
    public_key = private_key.get_public_key().to_bytes()
    return RSASignatureValidator.PUBLIC_KEY_FORMAT.replace(b"_key_", public_key)


def check_ttl(ttl_s: float) -> float:
    """A record lifetime every node accepts (protocol/signing.py, LifetimeValidator); ConfigError otherwise."""
    if not 2 <= ttl_s <= MAX_RECORD_TTL_S:
        raise ConfigError(f"a record's ttl must be between 2 and {MAX_RECORD_TTL_S:.0f} s, got {ttl_s}")
    return ttl_s


def _dated(value: object, stamp: str) -> float:
    """A stored record's timestamp field, or -inf where it has none (the schema will refuse it)."""
    date = value.get(stamp) if isinstance(value, dict) else None
    return float(date) if isinstance(date, (int, float)) else -math.inf


def kept_first(peer: PeerId, dated: float, *, prefer: Collection[PeerId], now: float) -> tuple[bool, float]:
    """The rank of a record where only so many are kept (SwarmRecords' docstring): the preferred peers' first, then
    the most recently dated, a date ahead of `now` counting as now. Sort by it in reverse."""
    return peer in prefer, min(dated, now)


def stored_bytes(value: dict) -> int:
    """About what a record's value takes in the DHT: serialized, with the signature the validators append."""
    return len(MSGPackSerializer.dumps(value)) + SIGNATURE_BYTES


def encode_record(record: pydantic.BaseModel) -> dict:
    """The msgpack-ready value of a record, refused here with a clear error if it would be too large to store."""
    value = record.dict()
    size = stored_bytes(value)
    if size > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"{type(record).__name__} of ~{size} bytes exceeds the {MAX_RECORD_BYTES}-byte DHT record limit"
        )
    return value


class SwarmRecords:
    """One swarm's signed records on a DHT: the schema follows from the key, and every call has a deadline.

    Readers get every valid record by the peer id of its signer (records that fail the schema are skipped and
    logged), at most `max_records` of them per key: anyone can make identities, so beyond that the records of the
    `prefer`red peers (a plan's members, the pinned coordinator) and then the most recently dated ones are kept. A
    record's date is its owner's last refresh (a date ahead of our clock counts as now); its lifetime buys it no
    place, or one store of many identities with the longest lifetime a node accepts would crowd out, for an hour,
    every newcomer that refreshes its record as volunteers do. A read or a store that takes
    longer than `timeout_s` raises TimeoutError (hivemind's DHT calls take no deadline of their own), so no loop
    of ours waits forever on a stuck DHT.
    """

    def __init__(self, dht: DHT, swarm: str, *, private_key: RSAPrivateKey | None = None,
                 timeout_s: float = DHT_TIMEOUT_S, max_records: int = MAX_RECORDS_PER_KEY) -> None:
        if timeout_s <= 0 or max_records < 1:
            raise ConfigError(f"need timeout_s > 0 and max_records >= 1, got {timeout_s} and {max_records}")
        self.dht, self.swarm, self.private_key, self.timeout_s = dht, check_swarm_name(swarm), private_key, timeout_s
        self.max_records = max_records

    async def peers(self, prefer: Collection[PeerId] = ()) -> dict[PeerId, PeerRecord]:
        return await self.read(PEERS_FIELD, prefer=prefer)

    async def assignments(self, coordinator: PeerId | None = None) -> dict[PeerId, Assignment]:
        """Plans by signer; the `coordinator`'s kept among a flood of others' (class docstring)."""
        return await self.read(ASSIGNMENT_FIELD, prefer=(coordinator,) if coordinator else ())

    async def progress(self) -> dict[PeerId, Progress]:
        return await self.read(PROGRESS_FIELD)

    async def refusals(self, coordinator: PeerId | None = None) -> dict[PeerId, Refusals]:
        return await self.read(REFUSED_FIELD, prefer=(coordinator,) if coordinator else ())

    async def read(self, field: str, *, prefer: Collection[PeerId] = ()) -> dict[PeerId, pydantic.BaseModel]:
        """Valid records under one of the swarm's keys, by signer (class docstring); TimeoutError past the
        deadline."""
        return {owner: record for owner, (record, _) in (await self.read_expiring(field, prefer=prefer)).items()}

    async def read_expiring(self, field: str, *, prefer: Collection[PeerId] = (), beam_size: int = DHT_BEAM_SIZE
                            ) -> dict[PeerId, tuple[pydantic.BaseModel, float]]:
        """As `read`, each record with the DHT time at which it expires unless its owner refreshes it; the search
        visits `beam_size` nodes (protocol/limits.py: VIEW_BEAM_SIZE)."""
        async with asyncio.timeout(self.timeout_s):
            found = await self.dht.get(dht_key(self.swarm, field), latest=True, return_future=True,
                                       beam_size=beam_size)
        return self._valid(field, found, prefer)

    async def read_many(self, fields: Collection[str], *, prefer: Collection[PeerId] = (),
                        beam_size: int = DHT_BEAM_SIZE) -> dict[str, dict[PeerId, pydantic.BaseModel]]:
        """As `read`, for several keys in one search of the DHT: the nodes on the way are asked for all the keys at
        once, so a peer that polls two keys (a volunteer's plan and the links it is asked to measure) costs the
        swarm's nodes about half the requests of two reads."""
        keys = {dht_key(self.swarm, field): field for field in fields}
        async with asyncio.timeout(self.timeout_s):
            found = await self.dht.run_coroutine(functools.partial(_latest_values, keys=tuple(keys),
                                                                   beam_size=beam_size), return_future=True)
        return {field: {owner: record for owner, (record, _) in self._valid(field, found.get(key), prefer).items()}
                for key, field in keys.items()}

    def _valid(self, field: str, found: ValueWithExpiration | None, prefer: Collection[PeerId]
               ) -> dict[PeerId, tuple[pydantic.BaseModel, float]]:
        """The valid records of one key's value as the DHT returned it, with their expiry (class docstring)."""
        schema = SCHEMAS[field]
        if found is None or not isinstance(found.value, dict):
            return {}
        signed = [(owner, item) for subkey, item in found.value.items()
                  if isinstance(subkey, bytes) and (owner := owner_peer_id(subkey)) is not None]
        if len(signed) > self.max_records:
            now, stamp = get_dht_time(), TIMESTAMP_FIELDS[field]
            signed.sort(key=lambda entry: kept_first(entry[0], _dated(entry[1].value, stamp), prefer=prefer, now=now),
                        reverse=True)
            logger.warning(f"{len(signed)} {field!r} records in the DHT; reading the {self.max_records} of the "
                           f"preferred peers and the most recently dated, skipping {len(signed) - self.max_records}")
            signed = signed[:self.max_records]
        records = {}
        for owner, item in signed:
            try:
                records[owner] = (schema.parse_obj(item.value), item.expiration_time)
            except (pydantic.ValidationError, TypeError) as e:  # TypeError: a list of pairs with odd keys
                logger.warning(f"Skipped a malformed {field!r} record from {owner}: {e}")
        return records

    async def publish(self, record: PeerRecord | Assignment | Progress | Refusals | LinkRequests, *, ttl_s: float
                      ) -> bool:
        """Stores our record under its key for `ttl_s` seconds; True if at least one node took it in time."""
        if self.private_key is None:
            raise ConfigError("publishing needs the private key that signs our records")
        value = encode_record(record)
        async with asyncio.timeout(self.timeout_s):
            return await self.dht.store(
                dht_key(self.swarm, FIELDS[type(record)]),
                value,
                expiration_time=get_dht_time() + ttl_s,
                subkey=owner_subkey(self.private_key),
                return_future=True,
                beam_size=DHT_BEAM_SIZE,
            )


async def _latest_values(_dht: DHT, node: DHTNode, *, keys: tuple[str, ...], beam_size: int
                         ) -> dict[str, ValueWithExpiration | None]:
    """Runs in the DHT's process (DHT.run_coroutine): the latest value of each key, as DHT.get(latest=True) finds
    one, from a single search of `beam_size` nodes."""
    return await node.get_many(keys, sufficient_expiration_time=math.inf, beam_size=beam_size)
