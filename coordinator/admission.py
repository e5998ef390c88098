"""Who the coordinator may plan: in an open swarm, every peer; in a closed one, only the peers on the operator's
allow-list or holding a join token this coordinator issued (protocol/join_tokens.py).

A refused peer keeps its place in the DHT (its records are valid, only not admitted), is never planned, not even
as a standby, and is named with the reason in the coordinator's Refusals record, which the monitor shows.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hivemind.utils.crypto import RSAPublicKey

from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.join_tokens import token_is_valid
from hetswarm.protocol.keys import is_peer_id
from hetswarm.protocol.records import PeerRecord

__all__ = ["Admission", "load_allow_list"]

logger = logging.getLogger(__name__)

def load_allow_list(path: Path) -> frozenset[str]:
    """Peer ids, one per line; blank lines and `#` comments are skipped. ConfigError names a bad line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read the allow-list {path}: {e}") from None
    allowed = set()
    for number, line in enumerate(lines, start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if not is_peer_id(entry):
            raise ConfigError(f"{path}:{number}: {entry!r} is not a peer id")
        allowed.add(entry)
    return frozenset(allowed)


@dataclass
class Admission:
    """The coordinator's admission rule (module docstring); open unless `closed`."""

    swarm: str
    closed: bool = False
    allow: frozenset[str] = frozenset()
    coordinator_key: RSAPublicKey | None = None
    """The key join tokens must be signed with: this coordinator's own."""
    _checked: dict[tuple[str, str], bool] = field(default_factory=dict)
    """(peer, token) → valid: an RSA check per token, not per read."""

    def __post_init__(self) -> None:
        if self.closed and not self.allow and self.coordinator_key is None:
            raise ConfigError("a closed swarm needs an allow-list or join tokens, or nobody can be admitted")

    def screen(self, records: Mapping[str, PeerRecord]) -> tuple[dict[str, PeerRecord], dict[str, str]]:
        """(admitted records, refused peer → reason)."""
        if not self.closed:
            return dict(records), {}
        admitted, refused = {}, {}
        for peer, record in records.items():
            if (reason := self._refusal(peer, record)) is None:
                admitted[peer] = record
            else:
                refused[peer] = reason
        return admitted, refused

    def _refusal(self, peer: str, record: PeerRecord) -> str | None:
        if peer in self.allow:
            return None
        token = record.join_token
        if token is None:
            return "not admitted: not on the allow-list and no join token"
        if self.coordinator_key is None:
            return "not admitted: not on the allow-list (this swarm takes no join tokens)"
        if (peer, token) not in self._checked:
            self._checked[(peer, token)] = token_is_valid(token, self.coordinator_key, self.swarm, peer)
            if not self._checked[(peer, token)]:
                logger.warning(f"Peer {peer} presents a join token this coordinator did not issue to it")
        return None if self._checked[(peer, token)] else "not admitted: its join token is not valid for it"
