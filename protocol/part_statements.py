"""A sender's signed statement of the gradient parts it sent one reducer in one all-reduce round.

A reducer's average is checked by re-reducing it (client/training/reduction_audit.py): a member asks the reducer to
show one part of its share as every sender sent it, and aggregates those itself. Shown on the reducer's word, the
parts could be any that fit its average; so each sender signs, before it sends its first part, the SHA-256 of every
part it sends that reducer (of the bytes on the wire), with the round's group id and the reducer's peer id. The
reducer checks the statement and each part against it as they arrive (a sender whose statement or part does not
match is left out of the round, as one that sends a bad part is), and shows the statements with the parts, so the
auditor can tell the parts are the senders' own. Signed with the member's identity (protocol/identity.py), like a
commit vote (protocol/vote_signing.py).
"""
from __future__ import annotations

import hashlib

from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey
from pydantic.v1 import BaseModel, Extra, ValidationError, constr

from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PEER_ID_PATTERN

__all__ = ["MAX_STATEMENT_BYTES", "MAX_STATEMENT_PARTS", "PartStatement", "part_digest", "read_statement",
           "signed_statement"]

MAX_STATEMENT_PARTS = 16384
"""Parts one statement may list: 8 GiB of fp32 values to one reducer at hivemind's 512 KiB parts."""
_DIGEST_CHARS = 64
_MAX_KEY_CHARS = 1024
MAX_STATEMENT_BYTES = MAX_STATEMENT_PARTS * _DIGEST_CHARS + 4 * _MAX_KEY_CHARS


class PartStatement(BaseModel):
    peer: constr(strict=True, regex=PEER_ID_PATTERN)
    digests: constr(strict=True, regex=r"^([0-9a-f]{64})*$", max_length=MAX_STATEMENT_PARTS * _DIGEST_CHARS)
    """The parts' SHA-256 digests, hex, one after the other in the order they are sent."""
    public_key: constr(strict=True, max_length=_MAX_KEY_CHARS)
    signature: constr(strict=True, max_length=_MAX_KEY_CHARS)

    class Config:
        extra = Extra.forbid
        allow_mutation = False

    def digest_list(self) -> list[str]:
        return [self.digests[i:i + _DIGEST_CHARS] for i in range(0, len(self.digests), _DIGEST_CHARS)]


def part_digest(buffer: bytes | memoryview) -> str:
    return hashlib.sha256(buffer).hexdigest()


def _signed_bytes(group_id: bytes, peer: str, reducer: str, digests: str) -> bytes:
    return b"hetswarm-parts\0" + group_id + f"\0{peer}\0{reducer}\0{digests}".encode()


def signed_statement(private_key: RSAPrivateKey, *, group_id: bytes, reducer: str, digests: list[str]) -> bytes:
    """This peer's statement of the parts (their `part_digest`s) it sends `reducer` in round `group_id`."""
    public_key = private_key.get_public_key()
    peer, joined = peer_id_of(public_key), "".join(digests)
    signature = private_key.sign(_signed_bytes(group_id, peer, reducer, joined))
    return PartStatement(peer=peer, digests=joined, public_key=public_key.to_bytes().decode(),
                         signature=signature.decode()).json().encode()


def read_statement(raw: bytes, *, group_id: bytes, sender: str, reducer: str, parts: int) -> list[str]:
    """The digests `sender` signed for the `parts` parts it sends `reducer` in round `group_id`.

    Raises:
        RejectedInput: the statement is malformed, oversized, of another peer, round or reducer, not signed by
            `sender`, or lists another number of parts.
    """
    if len(raw) > MAX_STATEMENT_BYTES:
        raise RejectedInput(f"a part statement of {len(raw)} bytes, over {MAX_STATEMENT_BYTES}")
    try:
        statement = PartStatement.parse_raw(raw)
        public_key = RSAPublicKey.from_bytes(statement.public_key.encode())
    except ValidationError as e:
        raise RejectedInput(f"a malformed part statement ({e.errors()[0]['msg']})") from None
    except Exception as e:  # cryptography's parsers raise several kinds on garbage
        raise RejectedInput(f"a part statement with a malformed key ({type(e).__name__})") from None
    if statement.peer != sender or peer_id_of(public_key) != sender:
        raise RejectedInput(f"a part statement of {statement.peer}, not of its sender {sender}")
    if not public_key.verify(_signed_bytes(group_id, sender, reducer, statement.digests),
                             statement.signature.encode()):
        raise RejectedInput(f"a part statement {sender} did not sign for this round and reducer")
    digests = statement.digest_list()
    if len(digests) != parts:
        raise RejectedInput(f"a part statement of {len(digests)} parts, where {parts} are sent")
    return digests
