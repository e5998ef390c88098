"""DHT key names of one swarm, derived from its name so that several swarms can share one DHT."""
from __future__ import annotations

import re

from hetswarm.protocol.errors import RejectedInput

_SWARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

PEERS_FIELD = "peers"
ASSIGNMENT_FIELD = "assignment"
PROGRESS_FIELD = "progress"


def check_swarm_name(swarm: str) -> str:
    if not _SWARM_NAME.match(swarm):
        raise RejectedInput(f"bad swarm name {swarm!r}: use 1-64 letters, digits, '_', '.' or '-'")
    return swarm


def dht_key(swarm: str, field: str) -> str:
    """The raw DHT key of one schema field; hivemind's SchemaValidator(prefix=swarm) expects exactly this form."""
    return f"{check_swarm_name(swarm)}_{field}"


def peers_key(swarm: str) -> str:
    return dht_key(swarm, PEERS_FIELD)


def assignment_key(swarm: str) -> str:
    return dht_key(swarm, ASSIGNMENT_FIELD)
