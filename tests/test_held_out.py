"""The held-out loss: the windows every pipeline measures, and the swarm's figure, believed where pipelines agree.

The forward-only pass through real stages is checked end to end in tests/test_training_correctness.py (the reported
loss is the one of the model the stages hold); here the parts: which text is held out, and how the members' reports
are weighed (client/peer/held_out.py).
"""
import asyncio
import time

import pytest
import torch

from hetswarm.client.peer.held_out import AGREEMENT, swarm_held_out
from hetswarm.client.training.data import HELD_OUT_BYTES, DataError, TokenSource, default_corpus
from hetswarm.client.training.neighbour_streams import Inbox
from hetswarm.protocol.records import Progress
from tests.helpers.swarm_records import IDS
from tests.helpers.tiny_training import assignment_for

SEQ_LEN = 16
WINDOWS = dict(micro_batch_size=3, micro_batches=2, seq_len=SEQ_LEN)
EVERY = 6


def test_every_pipeline_draws_the_same_held_out_windows_spread_evenly_over_other_generated_text():
    source = TokenSource.from_path(None)
    first, again = source.held_out_batch(micro_batch=0, **WINDOWS), source.held_out_batch(micro_batch=0, **WINDOWS)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # no step, no pipeline: one set for everyone
    inputs, targets = first
    assert inputs.shape == targets.shape == (3, SEQ_LEN) and torch.equal(inputs[:, 1:], targets[:, :-1])
    held_out = torch.tensor(list(source.held_out))
    windows = len(held_out) - SEQ_LEN
    rows = torch.cat([inputs, source.held_out_batch(micro_batch=1, **WINDOWS)[0]])
    for sequence, row in enumerate(rows):  # window i of 6 starts at i/6 of the way through
        start = sequence * windows // 6
        assert torch.equal(row, held_out[start:start + SEQ_LEN]), sequence
    # the generated held-out text is drawn with another seed than the training text (same grammar: its sentences
    # recur there, its paragraphs do not)
    assert len(source.held_out) == HELD_OUT_BYTES and bytes(source.held_out) != default_corpus(HELD_OUT_BYTES)


def test_data_without_a_usable_held_out_split_says_why():
    plain = TokenSource(b"some text " * 100)  # a user's text file: no split
    assert "hetswarm data prepare" in plain.held_out_problem(SEQ_LEN)
    with pytest.raises(DataError, match="hetswarm data prepare"):
        plain.held_out_batch(micro_batch=0, **WINDOWS)
    short = TokenSource(b"x" * 100, held_out=b"y" * SEQ_LEN)
    assert "fewer than seq_len + 1" in short.held_out_problem(SEQ_LEN)
    assert TokenSource(b"x" * 100, held_out=b"y" * (SEQ_LEN + 1)).held_out_problem(SEQ_LEN) is None


def plan(pipelines: int):
    chains = [[IDS[2 * p], IDS[2 * p + 1]] for p in range(pipelines)]
    return (assignment_for(chains, IDS[9], eval_every=EVERY), [chain[-1] for chain in chains],
            [chain[0] for chain in chains])


def report(peer: str, held_out_step: int | None, loss: float | None, *, step: int = 100, version: int = 1
           ) -> Progress:
    return Progress(peer_id=peer, assignment_version=version, step=step, loss=None, held_out_step=held_out_step,
                    held_out_loss=loss, tokens_per_s=1.0, compute_s=0.1, wait_s=0.0, updated_at=0.0)


def test_the_swarm_figure_is_the_one_most_last_stages_agree_on_and_a_liar_is_outvoted():
    assignment, last, _ = plan(3)
    honest = 2.5
    progress = {last[0]: report(last[0], 5, honest), last[1]: report(last[1], 5, honest * (1 + AGREEMENT / 2)),
                last[2]: report(last[2], 5, 0.1)}  # a member that claims a far better model
    held_out = swarm_held_out(assignment, progress)
    assert (held_out.step, held_out.agreeing, held_out.reported, held_out.corroborated) == (5, 2, 3, True)
    assert held_out.loss == pytest.approx(honest, rel=AGREEMENT) and "2 of 3 pipelines agree" in held_out.describe()


def test_a_member_cannot_hide_the_agreed_figure_by_claiming_a_later_or_unplanned_step():
    assignment, last, _ = plan(3)
    agreed = {last[0]: report(last[0], 11, 2.0), last[1]: report(last[1], 11, 2.0)}
    for claim in (report(last[2], 17, 0.1, step=12),  # a step it has not reached
                  report(last[2], 13, 0.1),  # a step the plan does not evaluate
                  report(last[2], 17, 0.1)):  # the next evaluation, before the others publish theirs
        held_out = swarm_held_out(assignment, agreed | {last[2]: claim})
        assert (held_out.step, held_out.loss, held_out.corroborated) == (11, 2.0, True), claim


def test_two_liars_against_two_honest_pipelines_are_contested_not_believed():
    assignment, last, _ = plan(4)
    progress = {peer: report(peer, 5, loss) for peer, loss in zip(last, (2.5, 2.5, 0.1, 0.1))}
    held_out = swarm_held_out(assignment, progress)
    assert held_out.contested and not held_out.corroborated and "contested" in held_out.describe()


def test_only_the_plans_own_last_stages_count():
    assignment, last, first = plan(2)
    progress = {last[0]: report(last[0], 11, 2.0),
                first[0]: report(first[0], 11, 2.0),  # not a last stage: its word is not a measurement
                IDS[8]: report(IDS[8], 11, 2.0),  # not a member
                last[1]: report(first[1], 11, 2.0)}  # a last stage's slot, signed for another peer
    held_out = swarm_held_out(assignment, progress)
    assert (held_out.step, held_out.loss, held_out.agreeing, held_out.corroborated) == (11, 2.0, 1, False)
    assert "not corroborated" in held_out.describe()
    assert swarm_held_out(assignment, {last[0]: report(last[0], 11, 2.0, version=2)}) is None  # another plan's
    assert swarm_held_out(assignment, {last[0]: report(last[0], None, None)}) is None  # nothing measured yet
    unplanned = assignment.copy(update={"eval_every": 0})
    assert swarm_held_out(unplanned, {peer: report(peer, 11, 2.0) for peer in last}) is None


def test_a_stage_gives_up_a_held_out_frame_once_its_neighbour_has_moved_on_to_the_next_step():
    """Its previous stage failed to send it and went on: waiting the whole frame timeout would hold up that step
    (client/training/neighbour_streams.py, NeighbourStreams.receive)."""
    held_out, next_step = ("held-out", 5, 0, 0), ("activations", 6, 0, 0)
    frame = torch.ones(2)

    async def take(*arrivals: tuple, timeout_s: float = 5.0):
        inbox = Inbox()
        waiting = asyncio.create_task(inbox.take(held_out, timeout_s, unless=next_step))
        await asyncio.sleep(0.01)
        for key in arrivals:
            assert inbox.put(key, frame) is None
        started = time.monotonic()
        result = await waiting
        return result, time.monotonic() - started, inbox

    result, waited, inbox = asyncio.run(take(next_step))
    assert result is None and waited < 1.0
    assert asyncio.run(take(held_out))[0] is frame
    with pytest.raises(TimeoutError):
        asyncio.run(take(timeout_s=0.1))

    async def next_step_still_there() -> torch.Tensor:  # the frame that ended the wait is the next step's input
        _, _, inbox = await take(next_step)
        return await inbox.take(next_step, 1.0)

    assert asyncio.run(next_step_still_there()) is frame
