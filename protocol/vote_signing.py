"""Signing a commit vote, and checking that a vote is its member's (the schemas are protocol/votes.py).

A signature covers the board's namespace (swarm and plan version), the step, the attempt, the member, the vote and
its cause, so that no vote can be replayed into another plan, step or attempt, or turned from success to failure.
"""
from __future__ import annotations

from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.votes import SignedVote

__all__ = ["forgery", "signed_vote"]


def _signed_bytes(namespace: str, step: int, attempt: int, peer: str, ok: bool, cause: str | None) -> bytes:
    return f"hetswarm-vote\0{namespace}\0{step}\0{attempt}\0{peer}\0{int(ok)}\0{cause or ''}".encode()


def signed_vote(private_key: RSAPrivateKey, *, namespace: str, step: int, attempt: int, ok: bool,
                cause: str | None = None) -> SignedVote:
    """This peer's vote, signed with its identity; a failure may name its cause."""
    public_key = private_key.get_public_key()
    peer = peer_id_of(public_key)
    signature = private_key.sign(_signed_bytes(namespace, step, attempt, peer, ok, cause))
    return SignedVote(peer=peer, ok=ok, cause=cause, public_key=public_key.to_bytes().decode(),
                      signature=signature.decode())


def forgery(vote: SignedVote, *, namespace: str, step: int, attempt: int) -> str | None:
    """Why `vote` is not its member's for this board and (step, attempt), or None when it is."""
    try:
        public_key = RSAPublicKey.from_bytes(vote.public_key.encode())
    except Exception as e:  # cryptography's parsers raise several kinds on garbage
        return f"a vote of {vote.peer} with a malformed key ({type(e).__name__})"
    if peer_id_of(public_key) != vote.peer:
        return f"a vote of {vote.peer} under another peer's key"
    if not public_key.verify(_signed_bytes(namespace, step, attempt, vote.peer, vote.ok, vote.cause),
                             vote.signature.encode()):
        return f"a vote of {vote.peer} it did not sign"
    return None
