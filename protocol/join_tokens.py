"""Join tokens of a closed swarm: the coordinator's signature over a swarm name and a volunteer's peer id.

The operator issues a token per volunteer (`hetswarm token PEER_ID`) and hands it over; the volunteer publishes
it in its PeerRecord (`hetswarm join --join-token`), and the coordinator plans only peers whose token it signed
(coordinator/admission.py). A token is bound to one peer id, so it is useless to anyone without that identity's
key, and to one swarm. This is how Psyche and Pluralis admit participants to a run they do not open to all.
"""
from __future__ import annotations

from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from hetswarm.protocol.keys import check_swarm_name
from hetswarm.protocol.limits import MAX_TOKEN_CHARS

__all__ = ["issue_token", "token_is_valid"]

_CONTEXT = b"hetswarm join token v1\n"


def _message(swarm: str, peer_id: str) -> bytes:
    return _CONTEXT + check_swarm_name(swarm).encode() + b"\n" + peer_id.encode()


def issue_token(coordinator_key: RSAPrivateKey, swarm: str, peer_id: str) -> str:
    """The token that admits `peer_id` to `swarm` under the coordinator whose key this is."""
    return coordinator_key.sign(_message(swarm, peer_id)).decode()


def token_is_valid(token: str, coordinator_key: RSAPublicKey, swarm: str, peer_id: str) -> bool:
    """Whether `token` was issued by this coordinator for this peer and swarm (a malformed token is not)."""
    return len(token) <= MAX_TOKEN_CHARS and coordinator_key.verify(_message(swarm, peer_id), token.encode())
