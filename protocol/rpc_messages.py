"""The small messages of the peer-to-peer calls that carry no tensors: strict schemas, one encoder, one reader.

Each travels as JSON in the `metadata` bytes of hivemind's `ExpertRequest`/`ExpertResponse`. `read_message` is the
only way in: it refuses a message over its type's byte limit before parsing it, and answers anything malformed with
`RejectedInput` (a verdict, as the frame decoder's FrameError is), so that a handler names the peer and goes on
serving. tests/helpers/fuzzing.py feeds it random and mutated bytes for every type here.

 * StepQuery            - "your state after step s": its hash (rpc_digest), then the state itself (rpc_state),
                          client/training/replica_sync.py
 * StateInfoRequest     - which of these units of a stage's state a holder has at a step, and their hash and size
 * StateInfo            - the answer (client/training/state_handoff.py) ...
 * NewestState          - ... a holder's newest state and the plan it follows
 * UnitRequest          - one unit's bytes (from an offset), which must have the hash the holder announced
 * RevealRequest        - a reducer's part as one member sent it, for an auditor (client/training/reduction_audit.py)
 * DialBackRequest      - the addresses to dial the asker back on (client/peer/reachability.py) ...
 * DialBackAnswer       - ... and whether the checker connected
"""
from __future__ import annotations

from typing import ClassVar, TypeVar

from pydantic.v1 import BaseModel, Extra, StrictBool, ValidationError, conint, conlist, constr

from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.limits import MAX_LAYERS, MAX_STEP

__all__ = ["DialBackAnswer", "DialBackRequest", "HeldUnit", "NewestState", "RevealRequest", "RpcMessage", "StateInfo",
           "StateInfoRequest", "StepQuery", "UnitRequest", "encode_message", "read_message"]

MAX_UNITS = MAX_LAYERS + 2
"""Units of one stage's state: its blocks, and the embedding and the head (client/training/stage_state.py)."""
MAX_DIAL_MADDRS = 8
"""Addresses a checker dials for one request."""
DETAIL_CHARS = 300

_Step = conint(strict=True, ge=0, le=MAX_STEP)
_Unit = constr(strict=True, regex=r"^(embed|head|blocks\.[0-9]{1,4})$")
_Sha256Hex = constr(strict=True, regex=r"^[0-9a-f]{64}$")


class _Strict(BaseModel):
    class Config:
        extra = Extra.forbid
        allow_mutation = False


class RpcMessage(_Strict):
    """A message of one call; `MAX_BYTES` bounds its encoding."""

    MAX_BYTES: ClassVar[int] = 1024


class StepQuery(RpcMessage):
    step: _Step


class StateInfoRequest(RpcMessage):
    MAX_BYTES: ClassVar[int] = 64 * 1024

    step: _Step
    units: conlist(_Unit, max_items=MAX_UNITS)


class HeldUnit(_Strict):
    digest: _Sha256Hex
    """SHA-256 of the unit's encoding (client/training/stage_state.py)."""
    size: conint(strict=True, ge=0, le=2**40)
    """Bytes of that encoding: a downloader stops reading past it."""


class StateInfo(RpcMessage):
    MAX_BYTES: ClassVar[int] = 160 * MAX_UNITS

    held: dict[_Unit, HeldUnit]


class NewestState(RpcMessage):
    version: conint(strict=True, ge=0, le=2**53)
    """The assignment version the holder follows (0: none yet)."""
    newest: _Step | None
    """The newest step it holds a state ready for (None: none)."""


class UnitRequest(RpcMessage):
    step: _Step
    unit: _Unit
    digest: _Sha256Hex
    offset: conint(strict=True, ge=0, le=2**40) = 0
    """The bytes of the unit's encoding already received: a stream cut short is asked for the rest."""


class RevealRequest(RpcMessage):
    group: constr(strict=True, regex=r"^(?:[0-9a-f]{2}){1,64}$")
    """The round's group id, hex."""
    part: conint(strict=True, ge=0, le=2**31)
    sender: conint(strict=True, ge=0, le=2**31)


class DialBackRequest(RpcMessage):
    MAX_BYTES: ClassVar[int] = 4096

    maddrs: conlist(constr(strict=True, max_length=256), max_items=MAX_DIAL_MADDRS)


class DialBackAnswer(RpcMessage):
    reachable: StrictBool | None
    """True: connected; False: could not; None: did not try (busy, a bad request)."""
    detail: constr(strict=True, max_length=DETAIL_CHARS)


Message = TypeVar("Message", bound=RpcMessage)


def encode_message(message: RpcMessage) -> bytes:
    return message.json().encode()


def read_message(kind: type[Message], raw: bytes) -> Message:
    """`raw` as a `kind`.

    Raises:
        RejectedInput: over `kind.MAX_BYTES`, or malformed (the reason says how).
    """
    if len(raw) > kind.MAX_BYTES:
        raise RejectedInput(f"a {kind.__name__} of {len(raw)} bytes, over its {kind.MAX_BYTES}-byte limit")
    try:
        return kind.parse_raw(raw)
    except (ValidationError, ValueError, UnicodeDecodeError) as e:
        raise RejectedInput(f"a malformed {kind.__name__}: {' '.join(str(e).split())[:300]}") from None
