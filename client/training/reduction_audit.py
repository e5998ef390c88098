"""Every average re-reduced: a member checks each reducer of its group on one part it picks, before it votes.

A reducer could send back any average within the bounds that ``ExactAllReduceRunner`` checks (finite, no longer
than an honest reduction could be), and every replica would apply it. BTARD (Gorbunov et al. 2022, "Secure
Distributed Training at Scale") closes this by re-reducing random parts; here each member asks every other reducer,
as soon as its average of the part comes, to show one part of its share, chosen by this member alone and told to
nobody before the reducer has sent that average: that part as each sender sent it, with the sender's signed statement of its parts
(protocol/part_statements.py), and the reducer's own part. The member checks each statement and digest, bounds the
reducer's own part as any sender's part is bounded, aggregates the parts itself as the reducer does, and compares
with the average it got. A reducer that cannot show parts its average is the aggregate of fails the member's
round, and is named as its cause, so no replica applies the step and the member's failure vote names it
(coordinator/failure_votes.py). A reducer that falsifies every part is caught by each partner at once; one that
falsifies a fraction f of its parts, by each partner with probability f per round.

What this buys: a reducer's own part is its own gradient, which nobody else can recompute, so a reducer may still
show an own part made up to fit a wrong average; but that part must pass the bound any sender's part must pass, and
goes through the same aggregation (CenteredClip clips it like any other). A hostile reducer can thus do no more to
its share than a hostile sender can do to every share; without the audit it could send any average within the
square of the part bound.

Audits run when the group's codec is fp32, where an average is a function of the parts alone; a lossy codec adds the
reducer's own error-feedback residual to its averages, which no auditor can know.
"""
from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from hivemind.compression import CompressionInfo
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2, runtime_pb2

from hetswarm.protocol.codecs import COMPRESSION_TYPES, decode_tensor, wire_bytes, wire_dtype_name
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.part_statements import part_digest, read_statement
from hetswarm.protocol.rpc_messages import RevealRequest, encode_message, read_message

if TYPE_CHECKING:
    from hetswarm.client.training.exact_allreduce import ExactAllReduceRunner

__all__ = ["AUDIT_TOLERANCE", "StatedParts", "audit_reducer", "audit_targets", "parse_reveal_request",
           "reveal_request", "shown_part"]

AUDIT_TOLERANCE = 1e-5
"""How far, relative to its norm, a re-reduced average may be from the reducer's: CenteredClip adds parts in the order
they arrived, so two honest reductions may differ in the last bits."""


def audit_targets(parts_by_peer: list[int], me: int) -> dict[int, int]:
    """For each other reducer with parts (by index in the group), the part of its share this member will check:
    drawn from the operating system's randomness, so no reducer can know it before it answers."""
    draw = random.SystemRandom()
    return {peer: draw.randrange(parts) for peer, parts in enumerate(parts_by_peer) if peer != me and parts > 0}


def reveal_request(group_id: bytes, part_index: int, sender_index: int) -> runtime_pb2.ExpertRequest:
    return runtime_pb2.ExpertRequest(metadata=encode_message(
        RevealRequest(group=group_id.hex(), part=part_index, sender=sender_index)))


def parse_reveal_request(request: runtime_pb2.ExpertRequest) -> tuple[bytes, int, int]:
    """(group id, part index, sender index) of a request to show a part.

    Raises:
        RejectedInput: a malformed request.
    """
    asked = read_message(RevealRequest, request.metadata)
    return bytes.fromhex(asked.group), asked.part, asked.sender


class StatedParts:
    """What a reducer's senders stated and sent it in one round: each sender's signed statement, the digests it lists,
    and its parts as they came; each part is checked against its statement as it arrives, and kept to show an
    auditor (`shown_part`)."""

    def __init__(self, *, group_id: bytes, senders: Sequence[PeerID], reducer: str, parts: int) -> None:
        self.group_id, self.senders, self.reducer, self.parts = group_id, senders, reducer, parts
        self.statements: dict[int, bytes] = {}
        """Sender index → the statement of the parts it sent this reducer ..."""
        self._stated: dict[int, list[str]] = {}
        """... and the digests it lists ..."""
        self.shown: dict[int, list[runtime_pb2.Tensor]] = {}
        """... and its parts as they came."""

    def refusal(self, message: averaging_pb2.AveragingData, *, sender_index: int, part_index: int) -> str | None:
        """Why a part is not one its sender stated, or None (the part is then kept); a stream's first message carries
        the statement (ExactAllReduceRunner.parts_for_reducer)."""
        if part_index == 0:
            try:
                self._stated[sender_index] = read_statement(
                    message.peer_id, group_id=self.group_id, sender=self.senders[sender_index].to_base58(),
                    reducer=self.reducer, parts=self.parts)
            except RejectedInput as e:
                return str(e)
            self.statements[sender_index] = message.peer_id
        stated = self._stated[sender_index]
        if part_index >= len(stated):
            return f"part {part_index}, more than the {len(stated)} its signed statement lists"
        if part_digest(message.tensor_part.buffer) != stated[part_index]:
            return f"part {part_index}, which its signed statement does not list"
        self.shown.setdefault(sender_index, []).append(message.tensor_part)
        return None


def shown_part(runner: ExactAllReduceRunner, part_index: int, sender_index: int) -> runtime_pb2.ExpertResponse:
    """What this reducer shows an auditor of part `part_index` of its share from sender `sender_index`: the part as
    it came, with the sender's statement; its own part with no statement; nothing for an index it does not hold.
    One unary answer per part: a streamed answer can be cut off after the request ends (docs/hivemind.md, pitfall
    13), and one part (at most hivemind's 512 KiB) with its statement stays well inside a message's bound."""
    if sender_index >= len(runner.sender_peer_ids) or part_index >= runner.tensor_part_reducer.num_parts:
        return runtime_pb2.ExpertResponse()
    if runner.sender_peer_ids[sender_index] == runner.peer_id:
        own = runner.own_parts[part_index]
        part = runner.wire_compression.compress(own, CompressionInfo.from_tensor(own))
        return runtime_pb2.ExpertResponse(tensors=[part])
    if runner.stated is None:  # no statements in this round: nothing to show
        return runtime_pb2.ExpertResponse()
    parts = runner.stated.shown.get(sender_index, [])
    return runtime_pb2.ExpertResponse(metadata=runner.stated.statements.get(sender_index, b""),
                                      tensors=parts[part_index:part_index + 1])


async def audit_reducer(runner: ExactAllReduceRunner, peer_index: int, part_index: int) -> str | None:
    """Why the reducer `peer_index` of `runner`'s round failed the check of part `part_index` (module docstring),
    or None when it passed."""
    reducer, stub = runner.ordered_peer_ids[peer_index], runner.peer_stub(runner.ordered_peer_ids[peer_index])
    others = [index for index, sender in enumerate(runner.sender_peer_ids) if sender != runner.peer_id]
    try:
        async with asyncio.timeout(runner.reducer_timeout):
            responses = await asyncio.gather(*(stub.rpc_reveal_part(reveal_request(runner.group_id, part_index, sender))
                                               for sender in others))
    except Exception as e:  # a dead peer, a timeout: it did not show them
        return f"did not show the parts of its average of part {part_index} ({e!r})"
    parts = [runner.audited_parts[peer_index]]  # ours, as we sent it: its statement is our own
    for sender, response in zip((runner.sender_peer_ids[index] for index in others), responses):
        try:
            parts.append(_checked_part(runner, response, sender, reducer, peer_index, part_index))
        except RejectedInput as e:
            return f"showed {'its own' if sender == reducer else f'the part of {sender}'} for part {part_index}: {e}"
    expected, got = runner.aggregate(parts), runner.audited.get(peer_index)
    if got is None or got.shape != expected.shape:
        return f"sent no average of part {part_index} of the shape of the parts it shows"
    distance = float((got - expected).norm())
    if not distance <= AUDIT_TOLERANCE * float(expected.norm()):
        return (f"sent an average of part {part_index} {distance:.3g} away from the aggregate of the parts it shows "
                f"(norm {float(expected.norm()):.3g})")
    return None


def _checked_part(runner: ExactAllReduceRunner, response: runtime_pb2.ExpertResponse, sender: PeerID,
                  reducer: PeerID, peer_index: int, part_index: int) -> torch.Tensor:
    """A shown part, decoded, once it is shown to be its sender's (or, the reducer's own, within the bound the
    reducer holds senders to, taken from the part this member sent it: other senders' parts it bounded itself).

    Raises:
        RejectedInput: it is not.
    """
    if len(response.tensors) != 1:
        raise RejectedInput(f"{len(response.tensors)} tensors instead of one")
    part = response.tensors[0]
    shape = list(runner.bounds.sent_shape(peer_index, part_index))
    layout = (COMPRESSION_TYPES[runner.codec], wire_dtype_name(runner.codec), shape,
              wire_bytes(runner.codec, math.prod(shape)))
    if (part.compression, part.dtype, list(part.size), len(part.buffer)) != layout:
        raise RejectedInput(f"a {part.dtype} part of size {list(part.size)} in {len(part.buffer)} bytes, where "
                            f"{shape} in {runner.codec} were sent")
    if sender != reducer:
        digests = read_statement(response.metadata, group_id=runner.group_id, sender=sender.to_base58(),
                                 reducer=reducer.to_base58(), parts=runner.tensor_part_container.num_parts_by_peer[
                                     peer_index])
        if part_digest(part.buffer) != digests[part_index]:
            raise RejectedInput("bytes its sender's statement does not list")
    decoded = decode_tensor(part, runner.codec)  # its type, shape and byte count are checked above
    norm = float(decoded.norm())
    if not math.isfinite(norm):
        raise RejectedInput("a part with NaN or infinite values")
    if sender == reducer and (bound := runner.bounds.sent_part_bound(peer_index, part_index)) is not None and norm > bound:
        raise RejectedInput(f"a part of norm {norm:.3g}, past what a sender may send it (at most {bound:.3g})")
    return decoded
