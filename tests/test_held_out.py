"""The held-out loss: the windows every pipeline measures, and the swarm's figure, believed where pipelines agree.

The forward-only pass through real stages is checked end to end in tests/test_training_correctness.py (the reported
loss is the one of the model the stages hold); here the parts: which text is held out, and how the members' reports
are weighed (client/peer/held_out.py).
"""
import pytest
import torch

from hetswarm.client.peer.held_out import AGREEMENT, swarm_held_out
from hetswarm.client.training.data import DataError, TokenSource, default_corpus
from hetswarm.protocol.records import Progress
from tests.helpers.swarm_records import IDS
from tests.helpers.tiny_training import assignment_for

SEQ_LEN = 16
WINDOWS = dict(micro_batch_size=3, micro_batches=2, seq_len=SEQ_LEN)


def test_every_pipeline_draws_the_same_held_out_windows_spread_over_text_it_never_trains_on():
    source = TokenSource.from_path(None)
    first, again = source.held_out_batch(micro_batch=0, **WINDOWS), source.held_out_batch(micro_batch=0, **WINDOWS)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # no step, no pipeline: one set for everyone
    inputs, targets = first
    assert inputs.shape == targets.shape == (3, SEQ_LEN) and torch.equal(inputs[:, 1:], targets[:, :-1])
    second = source.held_out_batch(micro_batch=1, **WINDOWS)[0]
    starts = [bytes(row[:SEQ_LEN].tolist()) for row in torch.cat([inputs, second])]
    assert len(set(starts)) == 6  # six different windows
    held_out = bytes(source.held_out)
    assert held_out not in default_corpus() and all(window in held_out for window in starts)
    assert second[-1].tolist() != list(held_out[-SEQ_LEN:])  # spread: the last window starts before the end


def test_a_text_file_has_no_held_out_split_and_says_how_to_get_one(tmp_path):
    (tmp_path / "notes.txt").write_text("some text " * 100)
    source = TokenSource.from_path(tmp_path / "notes.txt")
    with pytest.raises(DataError, match="hetswarm data prepare"):
        source.held_out_batch(micro_batch=0, **WINDOWS)
    short = TokenSource(b"x" * 100, held_out=b"y" * SEQ_LEN)
    with pytest.raises(DataError, match="fewer than seq_len"):
        short.held_out_batch(micro_batch=0, **WINDOWS)


def plan(pipelines: int):
    chains = [[IDS[2 * p], IDS[2 * p + 1]] for p in range(pipelines)]
    return assignment_for(chains, IDS[9]), [chain[-1] for chain in chains], [chain[0] for chain in chains]


def report(peer: str, step: int | None, loss: float | None, *, version: int = 1) -> Progress:
    return Progress(peer_id=peer, assignment_version=version, step=step or 0, loss=None, held_out_step=step,
                    held_out_loss=loss, tokens_per_s=1.0, compute_s=0.1, wait_s=0.0, updated_at=0.0)


def test_the_swarm_figure_is_the_one_most_last_stages_agree_on_and_a_liar_is_outvoted():
    assignment, last, first = plan(3)
    honest = 2.5
    progress = {last[0]: report(last[0], 5, honest), last[1]: report(last[1], 5, honest * (1 + AGREEMENT / 2)),
                last[2]: report(last[2], 5, 0.1)}  # a member that claims a far better model
    held_out = swarm_held_out(assignment, progress)
    assert (held_out.step, held_out.agreeing, held_out.reported, held_out.corroborated) == (5, 2, 3, True)
    assert held_out.loss == pytest.approx(honest, rel=AGREEMENT) and "2 of 3 pipelines agree" in held_out.describe()


def test_only_the_newest_step_of_the_plans_last_stages_counts():
    assignment, last, first = plan(2)
    progress = {last[0]: report(last[0], 11, 2.0), last[1]: report(last[1], 5, 3.0),  # behind: its report waits
                first[0]: report(first[0], 11, 2.0),  # not a last stage: its word is not a measurement
                IDS[8]: report(IDS[8], 11, 2.0),  # not a member
                IDS[7]: report(IDS[6], 11, 2.0)}  # signed by another peer than it names
    held_out = swarm_held_out(assignment, progress)
    assert (held_out.step, held_out.loss, held_out.agreeing, held_out.corroborated) == (11, 2.0, 1, False)
    assert "not corroborated" in held_out.describe()
    assert swarm_held_out(assignment, {last[0]: report(last[0], 11, 2.0, version=2)}) is None  # another plan's
    assert swarm_held_out(assignment, {last[0]: report(last[0], None, None)}) is None  # nothing measured yet
