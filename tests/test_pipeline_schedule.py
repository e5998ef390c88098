"""Pipeline schedules (client/training/pipeline_schedule.py) against a play of every stage of a pipeline.

Pure: each stage runs its pass order on its own clock; a forward waits for the previous stage's forward of the same
micro-batch, a backward for the next stage's backward and its own forward. The play checks that no schedule
deadlocks, that a stage holds no more micro-batches than the live model charges for (coordinator/scheduling/live_cost.py,
`in_flight`), and that the live model's compute + bubble terms are GPipe's makespan and bound 1F1B's.
"""
import itertools
import random

import pytest

from hetswarm.client.training.pipeline_schedule import pass_order
from hetswarm.coordinator.scheduling.live_cost import in_flight

SHAPES = [(d_pp, m) for d_pp, m in itertools.product(range(1, 6), range(1, 9))]


def play(schedule: str, forward_s: list[float], backward_s: list[float], micro_batches: int) -> float:
    """The makespan of one step with no communication time; fails on a deadlock."""
    d_pp = len(forward_s)
    orders = [pass_order(schedule, stage=s, d_pp=d_pp, micro_batches=micro_batches) for s in range(d_pp)]
    done, clock, position = {}, [0.0] * d_pp, [0] * d_pp
    moved = True
    while moved:
        moved = False
        for s, order in enumerate(orders):
            while position[s] < len(order):
                kind, m = order[position[s]]
                needs = ([("forward", s - 1, m)] if s > 0 else []) if kind == "forward" else \
                    ([("backward", s + 1, m)] if s < d_pp - 1 else []) + [("forward", s, m)]
                if not all(need in done for need in needs):
                    break
                start = max([clock[s], *(done[need] for need in needs)])
                clock[s] = done[(kind, s, m)] = start + (forward_s if kind == "forward" else backward_s)[s]
                position[s] += 1
                moved = True
    assert position == [len(order) for order in orders], f"{schedule} deadlocks at {position}"
    return max(clock)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_every_micro_batch_runs_forward_then_backward_once(schedule):
    for d_pp, micro_batches in SHAPES:
        for stage in range(d_pp):
            order = pass_order(schedule, stage=stage, d_pp=d_pp, micro_batches=micro_batches)
            assert sorted(order) == sorted(itertools.product(["backward", "forward"], range(micro_batches)))
            assert all(order.index(("forward", m)) < order.index(("backward", m)) for m in range(micro_batches))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_stage_holds_at_most_the_micro_batches_the_live_model_charges_for(schedule):
    for d_pp, micro_batches in SHAPES:
        charged = in_flight(schedule, d_pp=d_pp, micro_batches=micro_batches)
        for stage in range(d_pp):
            held, most = 0, 0
            for kind, _ in pass_order(schedule, stage=stage, d_pp=d_pp, micro_batches=micro_batches):
                held += 1 if kind == "forward" else -1
                most = max(most, held)
            assert most == charged[stage], (schedule, d_pp, micro_batches, stage)
    if schedule == "1f1b":
        assert in_flight(schedule, d_pp=4, micro_batches=8).tolist() == [4, 3, 2, 1]


def test_the_live_model_is_gpipes_makespan_and_bounds_1f1b():
    rng = random.Random(3)
    for d_pp, micro_batches in SHAPES:
        forward_s = [rng.uniform(1.0, 5.0) for _ in range(d_pp)]
        backward_s = [2 * f for f in forward_s]  # 4 of 6 FLOPs per parameter and token
        stage_s = [micro_batches * (f + b) for f, b in zip(forward_s, backward_s)]  # t_s, the whole step's
        live = max(stage_s) + (sum(stage_s) - max(stage_s)) / micro_batches  # compute + bubble
        assert play("gpipe", forward_s, backward_s, micro_batches) == pytest.approx(live, rel=1e-12)
        assert play("1f1b", forward_s, backward_s, micro_batches) <= live * (1 + 1e-12)
        equal = play("1f1b", [1.0] * d_pp, [2.0] * d_pp, micro_batches)
        assert equal == pytest.approx(play("gpipe", [1.0] * d_pp, [2.0] * d_pp, micro_batches), rel=1e-12)
