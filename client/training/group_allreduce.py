"""The all-reduce of one stage's gradients inside its fixed data-parallel group.

hivemind's ``AllReduceRunner`` (butterfly: reduce-scatter, then all-gather) is driven directly, without
``DecentralizedAverager``'s matchmaking: the assignment already fixes the group. Every member builds a runner
with the same sorted peer list and the same group id, a hash of (swarm, assignment version, stage, step,
attempt): a retried step never meets parts of its aborted attempt.
``GroupRouter`` is the servicer the runners call each other through: it hands each incoming part stream to the
local runner of that group id, waiting for it when a faster member's part arrives before this member has
finished its own backward pass (as ``DecentralizedAverager.rpc_aggregate_part`` does).

Each round's runner is an ``ExactAllReduceRunner`` (client/training/exact_allreduce.py): every member ends with the
very same bits, in the plan's all-reduce codec, and takes no sender's nor reducer's word for a part or an average.

A member whose stream of averages from a reducer ends short, without a refusal, asks that reducer again
(``rpc_fetch_averages``): the transport can lose answers the reducer sent after it had every part (a reset stream,
docs/hivemind.md pitfall 13), and the reducer keeps its averages for that (``_Answers``), as sent, until its next
round ends: one share of the stage's gradients, in the wire codec. It answers again only a member whose parts it
counted.

A sparse group (``density``) averages, each round, only the sample of blocks its members draw alike from the step
(client/training/gradient_sample.py); every other value of a member's gradient stays in its error-feedback residual,
and each member holds the same averages, zero outside the sample. A low-rank group (``low_rank``) averages each step
in two rounds, one per factor of its gradient matrices (client/training/low_rank.py). Both send one flat vector a
round, and a reducer's residual joins its own (`_flat_round`).

A dead or silent member does not make ``AllReduceRunner`` fail: it quietly averages the parts it got
(docs/hivemind.md, pitfall 7). ``StageGroup.average`` therefore checks ``failed_size`` and ``banned_senders``
after every round and raises ``PartialAllReduce`` rather than hand back a partial average.
"""
import asyncio
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import AsyncIterator  # ServicerBase recognises streams by typing.AsyncIterator only

import torch
from hivemind.averaging.allreduce import AllReduceRunner, GroupID
from hivemind.averaging.partition import (
    DEFAULT_PART_SIZE_BYTES,
)
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils.asyncio import achain, as_aiter
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.served import Served
from hetswarm.client.training.error_feedback import ErrorFeedback
from hetswarm.client.training.errors import PartialAllReduce
from hetswarm.client.training.exact_allreduce import ExactAllReduceRunner, RecordingCompression
from hetswarm.client.training.gradient_sample import GradientSample, flatten, unflatten
from hetswarm.client.training.low_rank import LowRankStep
from hetswarm.client.training.part_bounds import MAX_PART_NORM_RATIO
from hetswarm.client.training.reduction_audit import parse_reveal_request, shown_part
from hetswarm.protocol.codecs import allreduce_compression
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.records import Aggregation
from hetswarm.protocol.wire_format import BYTES_PER_VALUE, Codec

__all__ = ["GroupRouter", "StageGroup"]

logger = logging.getLogger(__name__)

_MIN_PART_BYTES = 4096


@dataclass(slots=True)
class _Round:
    """A local runner, and the part streams of other members it is still answering."""

    runner: "ExactAllReduceRunner"
    serving: int = 0
    drained: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class _Answers:
    """What a reducer sent back in one round, to send again to a member that lost it (module docstring)."""

    sent: dict[int, runtime_pb2.Tensor]
    """Part index → the average as sent (the runner's own dict: it fills as the round goes)."""
    banned: set[PeerID]
    complete: asyncio.Event
    runner: "ExactAllReduceRunner"
    """For an auditor: the parts this reducer was sent (reduction_audit.shown_part)."""


class GroupRouter(ServicerBase):
    """Routes ``rpc_aggregate_part`` streams to the runner of their group id, answers ``rpc_fetch_averages`` from
    the rounds it keeps; refuses non-members."""

    KEPT_ROUNDS = 2
    """Rounds whose averages are kept to send again: the current one and the one before it."""

    def __init__(self, members: Sequence[PeerID], *, join_wait_s: float, answer_wait_s: float) -> None:
        """
        Args:
            join_wait_s: how long a member's parts wait for this member to start their round.
            answer_wait_s: how long a member asking again waits for this reducer's averages.
        """
        self.members, self.join_wait_s, self.answer_wait_s = frozenset(members), join_wait_s, answer_wait_s
        self._rounds: dict[GroupID, _Round] = {}
        self._answers: dict[GroupID, _Answers] = {}  # insertion order: oldest first
        self._registered = asyncio.Condition()

    async def register(self, runner: "ExactAllReduceRunner") -> _Round:
        async with self._registered:
            self._rounds[runner.group_id] = round_ = _Round(runner)
            self._answers[runner.group_id] = _Answers(runner.sent, runner.banned_senders, runner.answered, runner)
            while len(self._answers) > self.KEPT_ROUNDS:
                del self._answers[next(iter(self._answers))]
            round_.drained.set()
            self._registered.notify_all()
        return round_

    def unregister(self, runner: AllReduceRunner) -> None:
        """Ends the round here; its averages stay, as sent, for a member that asks again."""
        self._rounds.pop(runner.group_id, None)

    async def _round_of(self, group_id: GroupID) -> _Round | None:
        try:
            async with asyncio.timeout(self.join_wait_s), self._registered:
                await self._registered.wait_for(lambda: group_id in self._rounds)
        except TimeoutError:
            return None
        return self._rounds.get(group_id)

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        if context.remote_id not in self.members:
            logger.warning(f"Refused all-reduce parts from {context.remote_id}: not a member of this stage group")
            yield averaging_pb2.AveragingData(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        try:
            async with asyncio.timeout(self.join_wait_s):
                first = await anext(stream)
        except (TimeoutError, StopAsyncIteration):
            yield averaging_pb2.AveragingData(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        round_ = await self._round_of(first.group_id)
        if round_ is None:
            logger.debug(f"No all-reduce round {first.group_id.hex()[:8]} here for {context.remote_id}")
            yield averaging_pb2.AveragingData(code=averaging_pb2.BAD_GROUP_ID)
            return
        round_.serving += 1
        round_.drained.clear()
        try:
            async for message in round_.runner.rpc_aggregate_part(achain(as_aiter(first), stream), context):
                yield message
        finally:
            round_.serving -= 1
            if round_.serving == 0:
                round_.drained.set()

    async def rpc_fetch_averages(
        self, request: averaging_pb2.AveragingData, context: P2PContext
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        """This reducer's averages of round ``request.group_id`` again, once it has them all."""
        answers = self._answers.get(request.group_id)
        if context.remote_id not in self.members or answers is None:
            yield averaging_pb2.AveragingData(code=averaging_pb2.BAD_GROUP_ID)
            return
        try:
            async with asyncio.timeout(self.answer_wait_s):
                await answers.complete.wait()
        except TimeoutError:
            yield averaging_pb2.AveragingData(code=averaging_pb2.INTERNAL_ERROR)
            return
        if context.remote_id in answers.banned:  # its parts are not in every average: it must not use them
            yield averaging_pb2.AveragingData(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        for part_index in range(len(answers.sent)):
            yield averaging_pb2.AveragingData(code=averaging_pb2.AVERAGED_PART, tensor_part=answers.sent[part_index])

    async def rpc_reveal_part(self, request: runtime_pb2.ExpertRequest, context: P2PContext
                              ) -> runtime_pb2.ExpertResponse:
        """One part of this reducer's share as one member sent it, for a member that audits it
        (client/training/reduction_audit.py), once it has sent its average of that part; nothing to a stranger, for
        a round it no longer keeps, or to a malformed request."""
        try:
            group_id, part_index, sender_index = parse_reveal_request(request)
        except RejectedInput as e:
            logger.info(f"Refused to show a part to {context.remote_id}: {e}")
            return runtime_pb2.ExpertResponse()
        answers = self._answers.get(group_id)
        if context.remote_id not in self.members or answers is None:
            return runtime_pb2.ExpertResponse()
        try:
            async with asyncio.timeout(self.answer_wait_s):
                await answers.runner.part_sent(part_index).wait()
        except TimeoutError:
            return runtime_pb2.ExpertResponse()
        return shown_part(answers.runner, part_index, sender_index)


class StageGroup(Served):
    """The replicas of one stage, averaging their gradients once per step."""

    def __init__(
        self, p2p: P2P, members: Sequence[PeerID], *, namespace: str, round_tag: str, sender_timeout_s: float,
        reducer_timeout_s: float, aggregation: Aggregation = "mean", codec: Codec = "fp32",
        density: float | None = None, low_rank: float | None = None,
        part_norm_ratio: float | None = MAX_PART_NORM_RATIO, private_key: RSAPrivateKey | None = None,
    ) -> None:
        """
        Args:
            members: every replica of this stage, this peer included; sorted here so all members agree.
            namespace: handler namespace, the same on every member (per swarm and stage).
            round_tag: names the assignment and stage; with the step it makes the group id of a round.
            sender_timeout_s: how long a member may be late with its parts before it is left out; covers the
                spread between the members' backward passes. Must be below ``reducer_timeout_s``.
            aggregation: how a reducer combines the members' versions of a part (ExactAllReduceRunner).
            codec: how parts travel (protocol/wire_format.py); a lossy one carries error feedback across steps.
            density: when set, each round averages only this share of the values, a sample of blocks every member
                draws alike (client/training/gradient_sample.py); the rest is carried by error feedback.
            low_rank: when set, each gradient matrix is averaged as low-rank factors holding this share of its values
                (client/training/low_rank.py); the rest is carried by error feedback.
            part_norm_ratio: how much larger than this member's own a sender's part may be (ExactAllReduceRunner);
                None for a group whose members hold different gradients by design (tied_embeddings.py).
            private_key: this member's identity: with it, an fp32 group's parts are signed and its reducers audited
                (client/training/reduction_audit.py).
        """
        if p2p.peer_id not in members:
            raise ValueError(f"{p2p.peer_id} is not among the group members {list(map(str, members))}")
        if not 0 < sender_timeout_s < reducer_timeout_s:
            raise ValueError(f"need 0 < sender_timeout_s < reducer_timeout_s, got {sender_timeout_s} and "
                             f"{reducer_timeout_s} (hivemind would ban reducers that wait for senders)")
        self.p2p, self.namespace, self.round_tag, self.aggregation = p2p, namespace, round_tag, aggregation
        if density is not None and low_rank is not None:
            raise ValueError("a stage group averages a sample (density) or factors (low_rank), not both")
        self.codec, self.density, self.low_rank = codec, density, low_rank
        self.part_norm_ratio, self.private_key = part_norm_ratio, private_key
        self.feedback = ErrorFeedback() if codec != "fp32" or density or low_rank else None
        self.members = sorted(members, key=lambda peer: peer.to_bytes())
        self.sender_timeout_s, self.reducer_timeout_s = sender_timeout_s, reducer_timeout_s
        self.router = GroupRouter(self.members, join_wait_s=sender_timeout_s, answer_wait_s=reducer_timeout_s)

    @property
    def handlers(self) -> GroupRouter:
        return self.router

    def group_id(self, step: int, attempt: int = 0, phase: str = "") -> GroupID:
        """`phase` names a round of a step that takes more than one (a low-rank all-reduce's factors)."""
        return hashlib.sha256(f"{self.round_tag}/step{step}/attempt{attempt}{phase}".encode()).digest()

    async def average(self, tensors: Sequence[torch.Tensor], *, step: int, attempt: int = 0) -> None:
        """Replaces ``tensors`` in place by their average over the group (equal weights); a group of one skips.

        The round runs on CPU copies (hivemind serializes CPU tensors only), and the tensors are written only
        when every member's every part was averaged.

        Raises:
            PartialAllReduce: a member failed or stayed silent; ``tensors`` are left untouched.
        """
        if len(self.members) == 1:
            return
        copies = [tensor.detach().to("cpu", torch.float32, copy=True) for tensor in tensors]
        if self.feedback is not None:
            self.feedback.begin(step, attempt)
            for index, copy in enumerate(copies):
                copy.add_(self.feedback.residual(("sent", index), copy))
        if self.low_rank is not None:
            averages, errors = await self._low_rank_average(copies, step, attempt)
        elif self.density is not None:
            averages, errors = await self._sparse_average(copies, step, attempt)
        else:
            errors = [torch.zeros_like(copy) for copy in copies]  # the codec's cuts, filled by the round
            averages, _ = await self._round(copies, step, attempt, feedback=self.feedback, sent_errors=errors)
        if self.feedback is not None:
            for index, error in enumerate(errors):
                self.feedback.record((step, attempt), ("sent", index), error)
            self.feedback.complete((step, attempt))
        for tensor, averaged in zip(tensors, averages):
            tensor.copy_(averaged)

    async def _sparse_average(self, copies: list[torch.Tensor], step: int, attempt: int
                              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The averages of this step's sample of `copies`, zero elsewhere, and each copy's residual: its values
        outside the sample, and what the codec cut from those in it."""
        flat = flatten(copies)
        sample = GradientSample(flat.numel(), density=self.density, round_tag=self.round_tag, step=step)
        average, error = await self._flat_round(sample.gather(flat), step, attempt)
        return (unflatten(sample.scatter(average, into=torch.zeros(sample.numel)), copies),
                unflatten(sample.scatter(error, into=flat), copies))

    async def _low_rank_average(self, copies: list[torch.Tensor], step: int, attempt: int
                                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The averages of `copies` as low-rank factors, and each copy's residual (client/training/low_rank.py); the
        factors' Q̄ carried as the residuals are, so that a retried step starts from the same Q."""
        factors = LowRankStep(copies, share=self.low_rank, round_tag=self.round_tag,
                              carried=lambda index, shape: self.feedback.carried(("factor", index), shape))
        first = factors.first_round()
        first_average, first_error = await self._flat_round(flatten(first), step, attempt, phase="/p")
        first_averages, first_errors = unflatten(first_average, first), unflatten(first_error, first)
        second = factors.second_round(first_averages)
        second_average, second_error = await self._flat_round(flatten(second), step, attempt, phase="/q")
        q_averages = unflatten(second_average, second)
        for index, q in zip(factors.factored, q_averages):
            self.feedback.record((step, attempt), ("factor", index), q)
        return (factors.averages(first_averages, q_averages),
                factors.residuals(first_errors, unflatten(second_error, second)))

    async def _flat_round(self, values: torch.Tensor, step: int, attempt: int, phase: str = ""
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """One round of a flat vector: its average, and what the codec cut from it on the way to the reducers plus,
        n times over, what it cut from the averages this member reduced (`_reduced_errors`)."""
        sent_error = torch.zeros_like(values)
        reduced = ErrorFeedback()  # this round's errors of the averages we reduce
        reduced.begin(step, attempt)
        (average,), runner = await self._round([values], step, attempt, phase=phase, feedback=reduced,
                                               sent_errors=[sent_error])
        return average, sent_error + len(self.members) * self._reduced_errors(runner, reduced)

    async def _round(self, sent: list[torch.Tensor], step: int, attempt: int, *, phase: str = "",
                     feedback: ErrorFeedback | None, sent_errors: list[torch.Tensor]
                     ) -> tuple[list[torch.Tensor], ExactAllReduceRunner]:
        """One all-reduce round of `sent`: the averages, bit-identical on every member, and its runner. Under a lossy
        codec, `sent_errors` receive what the codec cut from `sent`, and `feedback` the reducer's residuals."""
        wire_bytes = int(sum(part.numel() for part in sent) * BYTES_PER_VALUE[self.codec])
        runner = ExactAllReduceRunner(
            p2p=self.p2p, servicer_type=GroupRouter, prefix=self.namespace,
            group_id=self.group_id(step, attempt, phase), tensors=sent, ordered_peer_ids=self.members,
            peer_fractions=(1.0,) * len(self.members), sender_timeout=self.sender_timeout_s,
            reducer_timeout=self.reducer_timeout_s, aggregation=self.aggregation, codec=self.codec,
            feedback=feedback, feedback_round=(step, attempt), part_norm_ratio=self.part_norm_ratio,
            private_key=self.private_key,
            compression=(allreduce_compression(self.codec) if feedback is None
                         else RecordingCompression(allreduce_compression(self.codec), sent_errors)),
            # at least two parts per member: a member that reduces no part of its own cannot notice a dead sender
            part_size_bytes=max(_MIN_PART_BYTES, min(DEFAULT_PART_SIZE_BYTES, wire_bytes // (2 * len(self.members)))),
        )
        round_ = await self.router.register(runner)
        try:
            averages = await self._complete_round(runner, round_, step)
            await self._audit(runner, step)
        finally:
            runner.cancel_checks()
        return averages, runner

    @staticmethod
    def _reduced_errors(runner: ExactAllReduceRunner, reduced: ErrorFeedback) -> torch.Tensor:
        """What the codec cut from the averages this member reduced in a round of one flat vector, where they lie in
        it (its parts are views of it). A reducer's residual of a sample's or a factor's average would belong to
        other values at the next step; so it joins this member's own residual instead, n times over: n members'
        residuals are averaged when those values are next sent (with the mean; CenteredClip may clip it)."""
        errors = torch.zeros(runner.tensor_part_container.total_size)
        for (_, part_index), error in reduced.made().items():
            start = runner.parts_for_local_averaging[part_index].storage_offset()
            errors[start:start + error.numel()] = error.reshape(-1)
        return errors

    async def _complete_round(self, runner: ExactAllReduceRunner, round_: _Round, step: int) -> list[torch.Tensor]:
        """Runs the round; returns the reducers' averages, one per tensor, bit-identical on every member. They are
        kept apart from the round's own tensors, whose parts are views of them: once a reducer failed us, its
        remaining parts count as our own and the tensors they belong to are complete early, while our streams may
        still be serializing those parts; written over, they would no longer be the parts our signed statements
        list, and a reducer would name us for them.

        Raises:
            PartialAllReduce: the round broke, or some values were not averaged.
        """
        averages: list[torch.Tensor] = []
        try:
            async with asyncio.timeout(2 * self.reducer_timeout_s):
                async for averaged in runner:
                    averages.append(averaged)
        except Exception as e:  # a broken round, or TimeoutError: either way the average is incomplete
            raise PartialAllReduce(f"all-reduce of step {step} failed: {e!r}",
                                   cause=next(iter([*runner.bad_reducers, *runner.reducer_failures]), None)) from e
        finally:
            self.router.unregister(runner)
        await self._finish_answering(round_, step)
        failed_values, banned = runner.tensor_part_container.failed_size, runner.banned_senders
        if failed_values or banned:
            total = runner.tensor_part_container.total_size
            failures = "".join(f"; reducer {peer}: {why}" for peer, why in runner.reducer_failures.items())
            raise PartialAllReduce(
                f"all-reduce of step {step} is partial: {failed_values} of {total} values were not averaged"
                f"{', members left out: ' + ', '.join(map(str, banned)) if banned else ''}{failures}",
                cause=next(iter([*runner.bad_reducers, *banned, *runner.reducer_failures]), None))
        return averages

    @staticmethod
    async def _audit(runner: ExactAllReduceRunner, step: int) -> None:
        """The checks of one part of every other reducer's share, started as their averages came
        (client/training/reduction_audit.py).

        Raises:
            PartialAllReduce: a reducer failed its check; it is named as the cause.
        """
        audits = list(runner.audits.items())
        problems = await asyncio.gather(*(audit for _, audit in audits))
        for (peer_index, _), problem in zip(audits, problems):
            if problem is not None:
                reducer = runner.ordered_peer_ids[peer_index]
                raise PartialAllReduce(f"all-reduce of step {step}: reducer {reducer} {problem}", cause=reducer)

    async def _finish_answering(self, round_: _Round, step: int) -> None:
        """Waits until the other members got their averaged parts from us, so that leaving (or shutting down)
        right after the last step does not cut their round short. Our own average is complete either way."""
        try:
            async with asyncio.timeout(self.reducer_timeout_s):
                await round_.drained.wait()
        except TimeoutError:
            logger.debug(f"Members still reading their parts of step {step} after {self.reducer_timeout_s} s")
