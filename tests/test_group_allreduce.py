"""A stage group's all-reduce averages exactly, and a round that loses a member is reported, never used.

Three real p2p daemons in this process, one ``StageGroup`` each, driven through hivemind's AllReduceRunner.
Faults are members that misbehave in a chosen way: dead before the round, or alive but never joining it.
"""
import asyncio
import enum
from collections.abc import Callable

import pytest
import torch

from hetswarm.client.training.errors import PartialAllReduce
from hetswarm.client.training.gradient_sample import GradientSample
from hetswarm.client.training.group_allreduce import StageGroup
from hetswarm.client.training.low_rank import factor_rank
from tests.helpers.p2p_nodes import connected_p2ps

pytestmark = pytest.mark.swarm

SHAPES = [(40, 16), (16,), (7, 3, 5), (300,)]  # several tensors, as a stage's parameters are
PROMPT = {"sender_timeout_s": 1.0, "reducer_timeout_s": 2.0}
"""Timeouts for rounds in which a member is meant to die or stay silent: short, so the test ends soon."""
PATIENT = {"sender_timeout_s": 10.0, "reducer_timeout_s": 20.0}
"""Timeouts for rounds in which every member answers, if only with a bad part or average: on a loaded 2-core CI
machine a part can take over a second to arrive, and a round cut short there would fail the test for a reason it is
not about (a CI run once named an honest member, late, instead of the one sending huge parts). They cost nothing
when parts arrive on time."""


class Fault(enum.Enum):
    NONE = enum.auto()
    MEMBER_DEAD = enum.auto()
    """Its daemon is gone before the round starts."""
    MEMBER_SILENT = enum.auto()
    """Its handlers answer, but it never starts the round (stuck in its backward pass, say)."""


def _groups(p2ps, timeouts: dict[str, float], codecs: list[str] | None = None, **options) -> list[StageGroup]:
    """One stage group per daemon, all of them members, on the same round tag; member i sends in ``codecs[i]``."""
    members = [p2p.peer_id for p2p in p2ps]
    codecs = codecs or ["fp32"] * len(p2ps)
    return [StageGroup(p2p, members, namespace="ar-test_stage0_allreduce", round_tag="ar-test/v1/stage0",
                       codec=codec, **timeouts, **options) for p2p, codec in zip(p2ps, codecs)]


def _tensors(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


async def _round(fault: Fault) -> tuple[list[list[torch.Tensor]], list[BaseException | None]]:
    """Runs one round on the healthy members; returns their tensors afterwards and what each round raised."""
    async with connected_p2ps(3) as p2ps:
        groups = _groups(p2ps, PATIENT if fault is Fault.NONE else PROMPT)
        for group in groups:
            await group.attach()
        healthy = groups if fault is Fault.NONE else groups[:2]
        if fault is Fault.MEMBER_DEAD:
            await p2ps[2].shutdown()
        tensors = [_tensors(seed) for seed in range(len(healthy))]
        outcomes = await asyncio.gather(*(group.average(local, step=5) for group, local in zip(healthy, tensors)),
                                        return_exceptions=True)
        return tensors, list(outcomes)


async def _round_with_member_2(timeouts: dict[str, float], spoil: Callable[[list[torch.Tensor]], None] = lambda _: None,
                               hostile: list | None = None, **options) -> tuple[list[list[torch.Tensor]], list, str]:
    """One round of three members in which member 2 may misbehave: `spoil` changes its tensors before the round,
    and its peer id goes into `hostile`, where a patched runner class looks for it. Returns every member's tensors
    afterwards, what each member's round raised (None when it ended well), and member 2's id."""
    async with connected_p2ps(3) as p2ps:
        if hostile is not None:
            hostile.append(p2ps[2].peer_id)
        groups = _groups(p2ps, timeouts, **options)
        for group in groups:
            await group.attach()
        tensors = [_tensors(seed) for seed in range(3)]
        spoil(tensors[2])
        outcomes = await asyncio.gather(*(group.average(local, step=5) for group, local in zip(groups, tensors)),
                                        return_exceptions=True)
        return tensors, list(outcomes), str(p2ps[2].peer_id)


@pytest.mark.timeout(60)
def test_full_round_averages_with_equal_weights():
    tensors, outcomes = asyncio.run(_round(Fault.NONE))
    assert outcomes == [None, None, None]
    for index in range(len(SHAPES)):
        expected = torch.stack([_tensors(seed)[index] for seed in range(3)]).mean(0)
        for local in tensors:
            torch.testing.assert_close(local[index], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", [Fault.MEMBER_DEAD, Fault.MEMBER_SILENT], ids=lambda fault: fault.name.lower())
def test_round_with_a_lost_member_is_reported_and_leaves_tensors_untouched(fault):
    tensors, outcomes = asyncio.run(_round(fault))
    assert all(isinstance(outcome, PartialAllReduce) for outcome in outcomes), outcomes
    assert all("partial" in str(outcome) or "failed" in str(outcome) for outcome in outcomes)
    for seed, local in enumerate(tensors):
        for got, original in zip(local, _tensors(seed)):
            assert torch.equal(got, original)


@pytest.mark.timeout(30)
def test_a_group_of_one_keeps_its_tensors():
    async def alone() -> list[torch.Tensor]:
        async with connected_p2ps(1) as (p2p,):
            local = _tensors(0)
            group = StageGroup(p2p, [p2p.peer_id], namespace="ar-test_solo", round_tag="solo", **PROMPT)
            await group.average(local, step=0)
            return local

    for got, original in zip(asyncio.run(alone()), _tensors(0)):
        assert torch.equal(got, original)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("poison", ["nan", "huge"])
def test_a_member_that_sends_nan_or_huge_values_is_left_out_and_named_and_nobody_uses_the_round(poison):
    def poisoned(tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:  # every part of the attacker's contribution is poisoned
            if poison == "nan":
                tensor.view(-1)[::2] = float("nan")
            else:
                tensor.mul_(1e6)  # finite, but a million times an honest member's

    tensors, outcomes, attacker = asyncio.run(_round_with_member_2(PATIENT, poisoned))
    honest = tensors[:2]
    # the attacker's round too: left out, it gets no averages, not even by asking a reducer again
    assert all(isinstance(outcome, PartialAllReduce) for outcome in outcomes), outcomes
    assert all(outcome.cause == attacker for outcome in outcomes[:2]), [o.cause for o in outcomes[:2]]
    assert not any(outcome.peers for outcome in outcomes[:2])  # it answers: named as the cause, not as unreachable
    for seed, local in enumerate(honest):
        for got, original in zip(local, _tensors(seed)):
            assert torch.equal(got, original)  # untouched: no NaN reached an honest replica


@pytest.mark.timeout(60)
@pytest.mark.parametrize("poison", ["nan", "scaled"])
def test_a_reducer_that_answers_nan_or_scaled_averages_is_named_and_nobody_applies_them(poison, monkeypatch):
    """Member 2 reduces its share honestly for itself, but answers the others NaN or 10⁷ times the average: each of
    them refuses that share, names member 2, and keeps its tensors as they were."""
    from hetswarm.client.training import group_allreduce
    from hetswarm.protocol.codecs import encode_tensor

    hostile: list = []

    class Lying(group_allreduce.ExactAllReduceRunner):
        def _outgoing_part(self, part_index, averaged):
            serialized, decoded = super()._outgoing_part(part_index, averaged)
            if self.peer_id not in hostile:
                return serialized, decoded
            lie = decoded.clone()
            lie.view(-1)[::3] = float("nan")
            return encode_tensor(lie if poison == "nan" else decoded * 1e7, self.codec), decoded

    monkeypatch.setattr(group_allreduce, "ExactAllReduceRunner", Lying)

    tensors, outcomes, liar = asyncio.run(_round_with_member_2(PATIENT, hostile=hostile))
    honest = tensors[:2]
    for outcome in outcomes[:2]:
        assert isinstance(outcome, PartialAllReduce) and outcome.cause == liar and not outcome.peers, outcome
        assert "sent an average with" in str(outcome), outcome
    for seed, local in enumerate(honest):
        for got, original in zip(local, _tensors(seed)):
            assert torch.equal(got, original)


@pytest.mark.timeout(60)
def test_a_member_that_claims_a_large_weight_counts_as_much_as_any_other(monkeypatch):
    """hivemind takes each sender's weight from its message; here every part counts once, so the parts the honest
    members reduce are the plain mean (the attacker's own reductions are its own to corrupt: a reducer is trusted
    with its parts, see docs/hivemind.md)."""
    from hetswarm.client.training import group_allreduce

    attacker: list = []

    class Heavy(group_allreduce.ExactAllReduceRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs, weight=1000.0 if kwargs["p2p"].peer_id in attacker else 1.0)

    monkeypatch.setattr(group_allreduce, "ExactAllReduceRunner", Heavy)

    tensors, outcomes, _ = asyncio.run(_round_with_member_2(PATIENT, hostile=attacker))
    assert outcomes == [None, None, None], outcomes
    honest = tensors[:2]
    plain = torch.cat([torch.stack([_tensors(s)[i] for s in range(3)]).mean(0).flatten() for i in range(len(SHAPES))])
    for local in honest:
        got = torch.cat([t.flatten() for t in local])
        equal = torch.isclose(got, plain, rtol=1e-5, atol=1e-6).float().mean()
        assert equal >= 0.6, f"only {equal:.0%} of the values are the plain mean"  # ~2/3: the honest reducers' parts


@pytest.mark.timeout(60)
def test_averages_lost_on_the_way_back_are_asked_for_again_and_the_round_equals_a_fault_free_one(monkeypatch):
    """The transport loses what one reducer sends one member after it counted that member's parts (a reset stream,
    docs/hivemind.md pitfall 13): the member asks again and ends the round with the bits a fault-free round gives."""
    from hetswarm.client.training import group_allreduce

    lossy: list = []  # (reducer, member whose averages it loses)

    class Lossy(group_allreduce.ExactAllReduceRunner):
        async def reduce_sender_parts(self, stream, sender_index):
            answers = super().reduce_sender_parts(stream, sender_index)
            if (self.peer_id, self.sender_peer_ids[sender_index]) not in lossy:
                async for answer in answers:
                    yield answer
                return
            async for _ in answers:  # counted, answered, and lost on the way
                pass

    fault_free, outcomes = asyncio.run(_round(Fault.NONE))
    assert outcomes == [None, None, None]
    monkeypatch.setattr(group_allreduce, "ExactAllReduceRunner", Lossy)

    async def lossy_round() -> tuple[list[list[torch.Tensor]], list]:
        async with connected_p2ps(3) as p2ps:
            lossy.append((p2ps[0].peer_id, p2ps[2].peer_id))
            groups = _groups(p2ps, PATIENT)
            for group in groups:
                await group.attach()
            tensors = [_tensors(seed) for seed in range(3)]
            outcomes = await asyncio.gather(*(group.average(local, step=5) for group, local in zip(groups, tensors)),
                                            return_exceptions=True)
            return tensors, list(outcomes)

    tensors, outcomes = asyncio.run(lossy_round())
    assert outcomes == [None, None, None], outcomes
    for got, expected in zip(tensors, fault_free):
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("aggregation", ["mean", "centered_clip"])
def test_centered_clip_keeps_a_scaled_contribution_from_moving_the_average(aggregation):
    """A member sends 100× its gradients (under the 1000× ban): the mean follows it, CenteredClip stays with the
    two honest members."""
    def scaled(tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            tensor.mul_(100.0)

    results, outcomes, _ = asyncio.run(_round_with_member_2(PATIENT, scaled, aggregation=aggregation))
    assert outcomes == [None, None, None], outcomes
    honest = torch.cat([torch.stack([_tensors(s)[i] for s in range(2)]).mean(0).flatten() for i in range(len(SHAPES))])
    got = [torch.cat([t.flatten() for t in local]) for local in results]
    assert all(torch.equal(got[0], other) for other in got[1:])  # every member holds the same bits either way
    error = float((got[0] - honest).norm() / honest.norm())
    assert error > 20 if aggregation == "mean" else error < 2, error  # honest seeds differ as much as any two


async def _compressed_rounds(codecs: list[str], steps: int, **options) -> tuple[list[list[list[torch.Tensor]]],
                                                                                list[list], torch.Tensor | None]:
    """`steps` rounds of three members whose groups send in `codecs`: each member's tensors after every round, what
    each member raised in every round, and the residuals the last round left (flat; None without error feedback or
    after a failed round): the members' mean residual of what they sent, plus each reducer's residual of the
    averages it sent back (none in a sparse round)."""
    async with connected_p2ps(3) as p2ps:
        groups = _groups(p2ps, PATIENT if len(set(codecs)) == 1 else PROMPT, codecs, **options)
        for group in groups:
            await group.attach()
        history, outcomes = [], []
        for step in range(steps):
            tensors = [_tensors(100 * step + seed) for seed in range(3)]
            outcomes.append(list(await asyncio.gather(
                *(group.average(local, step=step) for group, local in zip(groups, tensors)), return_exceptions=True)))
            history.append(tensors)
        if groups[0].feedback is None or any(any(round_) for round_ in outcomes):
            return history, outcomes, None
        made = [group.feedback._made for group in groups]  # noqa: SLF001 - what the last round left
        sent = torch.stack([torch.cat([m[("sent", i)].flatten() for i in range(len(SHAPES))]) for m in made]).mean(0)
        by_peer = {group.p2p.peer_id: m for group, m in zip(groups, made)}  # reducers own consecutive parts,
        reduced = [by_peer[peer][key].flatten() for peer in groups[0].members  # in the group's order
                   for key in sorted(k for k in by_peer[peer] if k[0] == "reduced")]
        return history, outcomes, sent + torch.cat(reduced) if reduced else sent


@pytest.mark.timeout(90)
@pytest.mark.parametrize("codec", ["fp16", "8bit"])
def test_a_compressed_round_leaves_every_member_with_the_same_bits_and_error_feedback_loses_nothing(codec):
    """Σ_t average_t = Σ_t mean_t − (the residuals left): what a round did not deliver is carried, never dropped."""
    steps = 6
    history, outcomes, residuals = asyncio.run(_compressed_rounds([codec] * 3, steps))
    assert outcomes == [[None, None, None]] * steps
    flat = [[torch.cat([t.flatten() for t in local]) for local in round_] for round_ in history]
    for round_ in flat:
        assert all(torch.equal(round_[0], other) for other in round_[1:])  # replicas stay bit-identical
    means = _means(steps)
    one_step_error = max(float((round_[0] - mean).abs().max()) for round_, mean in zip(flat, means))
    assert 0 < one_step_error < (0.002 if codec == "fp16" else 0.2)
    delivered = sum(round_[0] for round_ in flat)
    assert float(residuals.abs().max()) > 0
    torch.testing.assert_close(delivered + residuals, sum(means), rtol=0, atol=1e-5)


def _means(steps: int) -> list[torch.Tensor]:
    """The exact average of every round of `_compressed_rounds`, flat."""
    return [torch.cat([torch.stack([_tensors(100 * step + s)[i] for s in range(3)]).mean(0).flatten()
                       for i in range(len(SHAPES))]) for step in range(steps)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("codec", ["fp32", "8bit"])
def test_a_sparse_round_sends_its_sample_alike_and_error_feedback_carries_the_rest(codec):
    """Each round delivers the same blocks to every member, the rest as zeros; Σ_t average_t = Σ_t mean_t − the
    residuals left, so what a round did not send is carried to later rounds, never dropped."""
    steps, density = 6, 0.4  # SHAPES make 5 blocks of 256 values: 2 a round
    history, outcomes, residuals = asyncio.run(_compressed_rounds([codec] * 3, steps, density=density))
    assert outcomes == [[None, None, None]] * steps
    flat = [[torch.cat([t.flatten() for t in local]) for local in round_] for round_ in history]
    samples = [GradientSample(flat[0][0].numel(), density=density, round_tag="ar-test/v1/stage0", step=step)
               for step in range(steps)]
    for round_, sample in zip(flat, samples):
        assert all(torch.equal(round_[0], other) for other in round_[1:])  # replicas stay bit-identical
        in_sample = sample.scatter(sample.gather(torch.ones_like(round_[0])), into=torch.zeros_like(round_[0])).bool()
        assert not round_[0][~in_sample].any()
        assert float((round_[0][in_sample] != 0).float().mean()) > 0.9  # 8-bit rounds a few averages to zero
    assert len({tuple(sample.chosen.tolist()) for sample in samples}) > 1  # the sample moves from step to step
    torch.testing.assert_close(sum(round_[0] for round_ in flat) + residuals, sum(_means(steps)), rtol=0, atol=1e-5)


@pytest.mark.timeout(60)
def test_a_member_that_sends_in_another_codec_is_left_out_and_named():
    history, outcomes, _ = asyncio.run(_compressed_rounds(["8bit", "8bit", "fp16"], steps=1))
    assert all(isinstance(outcome, PartialAllReduce) for outcome in outcomes[0][:2]), outcomes
    for seed, local in enumerate(history[0][:2]):
        for got, original in zip(local, _tensors(seed)):
            assert torch.equal(got, original)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("codec", ["fp32", "8bit"])
def test_a_low_rank_round_applies_the_same_factors_everywhere_and_error_feedback_carries_the_rest(codec):
    """Two rounds a step, each member applying the same bits; what the factors left out waits in the residuals:
    Σ_t average_t = Σ_t mean_t − the residuals left."""
    steps = 6
    history, outcomes, residuals = asyncio.run(_compressed_rounds([codec] * 3, steps, low_rank=0.25))
    assert outcomes == [[None, None, None]] * steps
    flat = [[torch.cat([t.flatten() for t in local]) for local in round_] for round_ in history]
    for round_ in flat:
        assert all(torch.equal(round_[0], other) for other in round_[1:])  # replicas stay bit-identical
    means = _means(steps)
    matrix = history[0][0][0]  # (40, 16), averaged as factors of rank 3
    assert int(torch.linalg.matrix_rank(matrix)) == 3
    one_step = [float((round_[0] - mean).norm() / mean.norm()) for round_, mean in zip(flat, means)]
    assert 0.1 < one_step[0] < 1  # a projection: never more than the average itself is lost
    assert float(residuals.abs().max()) > 0.1
    torch.testing.assert_close(sum(round_[0] for round_ in flat) + residuals, sum(means), rtol=0, atol=1e-4)


@pytest.mark.timeout(60)
def test_a_low_rank_round_averages_matrices_of_low_rank_exactly():
    """Members whose matrices have rank 1 average to rank 3 at most, which factors of rank 3 hold: the first step's
    average is the exact mean, to float rounding."""
    async def rounds() -> list[list[torch.Tensor]]:
        async with connected_p2ps(3) as p2ps:
            groups = _groups(p2ps, PATIENT, low_rank=0.25)
            for group in groups:
                await group.attach()
            tensors = [[torch.outer(torch.randn(40), torch.randn(16)), torch.randn(16)] for _ in groups]
            means = [torch.stack([local[i] for local in tensors]).mean(0) for i in range(2)]
            await asyncio.gather(*(group.average(local, step=0) for group, local in zip(groups, tensors)))
            return [means, *tensors]

    assert factor_rank((40, 16), 0.25) == 3
    means, *results = asyncio.run(rounds())
    for local in results:
        for got, mean in zip(local, means):
            torch.testing.assert_close(got, mean, rtol=0, atol=1e-5)
