"""Commit votes as they travel between a plan's members: each signed by the member that cast it.

Members vote on every (step, attempt) and relay each other's votes, so that a peer learns the vote of a member that
died after voting (client/training/step_commit.py). Unsigned, a relay could forge any member's failure and freeze
the run. A vote is therefore its member's RSA signature (its libp2p identity, protocol/identity.py) over the
board's namespace (which names the swarm and the plan version), the step, the attempt and the vote, with the
public key it checks against: the key's peer id must be the member's. A vote that fails either check is forged,
and whoever relayed it is named.
"""
from __future__ import annotations

from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey
from pydantic.v1 import BaseModel, Extra, StrictBool, ValidationError, conint, conlist, constr

from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PEER_ID_PATTERN
from hetswarm.protocol.limits import MAX_PEERS_PER_ASSIGNMENT, MAX_STEP

__all__ = ["MAX_VOTE_MESSAGE_BYTES", "SignedVote", "VoteMessage", "forgery", "read_votes", "signed_vote"]

_MAX_KEY_CHARS = 1024
"""An RSA public key in OpenSSH form, or a base64 signature: 2048- and 4096-bit keys fit."""
MAX_VOTE_MESSAGE_BYTES = 64 * 1024 + MAX_PEERS_PER_ASSIGNMENT * (2 * _MAX_KEY_CHARS + 128)
"""A message with every member's vote, each with its key and signature."""


class SignedVote(BaseModel):
    peer: constr(strict=True, regex=PEER_ID_PATTERN)
    ok: StrictBool
    """Success (True) or failure (False) of the member's part of the attempt."""
    public_key: constr(strict=True, max_length=_MAX_KEY_CHARS)
    """The member's public key, in OpenSSH form (hivemind's RSAPublicKey.to_bytes)."""
    signature: constr(strict=True, max_length=_MAX_KEY_CHARS)
    """Base64 of the member's signature over `_signed_bytes` (hivemind's RSAPrivateKey.sign)."""

    class Config:
        extra = Extra.forbid
        allow_mutation = False


class VoteMessage(BaseModel):
    """Every vote a peer knows for one (step, attempt): what `rpc_exchange` sends and answers."""

    step: conint(strict=True, ge=0, le=MAX_STEP)
    attempt: conint(strict=True, ge=0, le=MAX_STEP)
    votes: conlist(SignedVote, max_items=MAX_PEERS_PER_ASSIGNMENT)

    class Config:
        extra = Extra.forbid


def _signed_bytes(namespace: str, step: int, attempt: int, peer: str, ok: bool) -> bytes:
    return f"hetswarm-vote\0{namespace}\0{step}\0{attempt}\0{peer}\0{int(ok)}".encode()


def read_votes(message: bytes) -> VoteMessage:
    """A peer's vote message, parsed; its votes are still to be checked (`forgery`).

    Raises:
        ValueError: the message is oversized or malformed (the reason says how).
    """
    if len(message) > MAX_VOTE_MESSAGE_BYTES:
        raise ValueError(f"vote message of {len(message)} bytes, over {MAX_VOTE_MESSAGE_BYTES}")
    try:
        return VoteMessage.parse_raw(message)
    except (ValidationError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed vote message: {e}") from None


def signed_vote(private_key: RSAPrivateKey, *, namespace: str, step: int, attempt: int, ok: bool) -> SignedVote:
    """This peer's vote, signed with its identity."""
    public_key = private_key.get_public_key()
    peer = peer_id_of(public_key)
    signature = private_key.sign(_signed_bytes(namespace, step, attempt, peer, ok))
    return SignedVote(peer=peer, ok=ok, public_key=public_key.to_bytes().decode(), signature=signature.decode())


def forgery(vote: SignedVote, *, namespace: str, step: int, attempt: int) -> str | None:
    """Why `vote` is not its member's for this board and (step, attempt), or None when it is."""
    try:
        public_key = RSAPublicKey.from_bytes(vote.public_key.encode())
    except Exception as e:  # cryptography's parsers raise several kinds on garbage
        return f"a vote of {vote.peer} with a malformed key ({type(e).__name__})"
    if peer_id_of(public_key) != vote.peer:
        return f"a vote of {vote.peer} under another peer's key"
    if not public_key.verify(_signed_bytes(namespace, step, attempt, vote.peer, vote.ok), vote.signature.encode()):
        return f"a vote of {vote.peer} it did not sign"
    return None
