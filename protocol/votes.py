"""Commit votes as they travel between a plan's members: each signed by the member that cast it.

Members vote on every (step, attempt) and relay each other's votes, so that a peer learns the vote of a member that
died after voting (client/training/step_commit.py). Unsigned, a relay could forge any member's failure and freeze
the run. A vote is therefore its member's RSA signature (its libp2p identity, protocol/identity.py) over the
board's namespace (which names the swarm and the plan version), the step, the attempt, the vote and its cause, with
the public key it checks against: the key's peer id must be the member's (protocol/vote_signing.py, which holds the
hivemind side, so that this module and the records that carry votes import without it). A vote that fails either
check is forged, and whoever relayed it is named.

A failure vote names its cause: the member whose frame, part or average failed this one's attempt, or nobody (its
own failure). Signed, the failure votes of the attempts a member aborted are evidence no member can make up: a
member shows them to the coordinator (`AbortedAttempt`, in its Progress record), which plans out whoever they
implicate at every abort of a step (coordinator/failure_votes.py).
"""
from __future__ import annotations

from pydantic.v1 import BaseModel, Extra, StrictBool, ValidationError, conint, conlist, constr, root_validator

from hetswarm.protocol.keys import PEER_ID_PATTERN
from hetswarm.protocol.limits import MAX_FAILURES_PER_ATTEMPT, MAX_PEERS_PER_ASSIGNMENT, MAX_STEP

__all__ = ["MAX_VOTE_MESSAGE_BYTES", "AbortedAttempt", "SignedVote", "VoteMessage", "read_votes"]

_MAX_KEY_CHARS = 1024
"""An RSA public key in OpenSSH form, or a base64 signature: 2048- and 4096-bit keys fit."""
MAX_VOTE_MESSAGE_BYTES = 64 * 1024 + MAX_PEERS_PER_ASSIGNMENT * (2 * _MAX_KEY_CHARS + 128)
"""A message with every member's vote, each with its key and signature."""


class SignedVote(BaseModel):
    peer: constr(strict=True, regex=PEER_ID_PATTERN)
    ok: StrictBool
    """Success (True) or failure (False) of the member's part of the attempt."""
    cause: constr(strict=True, regex=PEER_ID_PATTERN) | None = None
    """A failure's cause: the member whose frame, part or average failed it; None for its own (or unattributed)
    failure. A success names none."""
    public_key: constr(strict=True, max_length=_MAX_KEY_CHARS)
    """The member's public key, in OpenSSH form (hivemind's RSAPublicKey.to_bytes)."""
    signature: constr(strict=True, max_length=_MAX_KEY_CHARS)
    """Base64 of the member's signature over `_signed_bytes` (hivemind's RSAPrivateKey.sign)."""

    class Config:
        extra = Extra.forbid
        allow_mutation = False

    @root_validator(skip_on_failure=True)
    def _success_names_no_cause(cls, values: dict) -> dict:
        if values["ok"] and values["cause"] is not None:
            raise ValueError("a success vote names no cause")
        return values


class VoteMessage(BaseModel):
    """Every vote a peer knows for one (step, attempt): what `rpc_exchange` sends and answers."""

    step: conint(strict=True, ge=0, le=MAX_STEP)
    attempt: conint(strict=True, ge=0, le=MAX_STEP)
    votes: conlist(SignedVote, max_items=MAX_PEERS_PER_ASSIGNMENT)

    class Config:
        extra = Extra.forbid


class AbortedAttempt(BaseModel):
    """The failure votes a member holds for one attempt the plan aborted: evidence it shows the coordinator."""

    step: conint(strict=True, ge=0, le=MAX_STEP)
    attempt: conint(strict=True, ge=0, le=MAX_STEP)
    failures: conlist(SignedVote, min_items=1, max_items=MAX_FAILURES_PER_ATTEMPT)

    class Config:
        extra = Extra.forbid


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
