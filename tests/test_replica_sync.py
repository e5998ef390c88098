"""Replicas that differ are repaired from the majority's state, and only with it (client/training/replica_sync.py).

Three real p2p daemons in this process, one ReplicaSync each: two replicas hold one state, the third another.
A replica that reports the majority's hash but sends other bytes is not believed: the repair takes the state from
a replica whose bytes have the hash, or, when none sends them, keeps its own. Ties between hashes are broken by
a lottery salted by the plan and the step, not by the lowest peer id.
"""
import asyncio

import pytest
import torch

from hetswarm.client.training.model import build_stage
from hetswarm.client.training.replica_sync import ReplicaSync
from hetswarm.client.training.stage_state import StageState, majority_digest
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.model_config import get_model_config
from tests.helpers.p2p_nodes import connected_p2ps

TINY = get_model_config("tiny")


def lie(sync: ReplicaSync) -> None:
    """Makes `sync` report its true hash and send a state of other weights (on the instance: hivemind names a
    servicer's handlers after its class, so a subclass would serve under other names)."""
    honest = sync._snapshot

    def snapshot() -> tuple[bytes, bytes]:
        other = build_stage(TINY, 0, 2, seed=99)
        return honest()[0], StageState.capture(other, StageConfig().build_optimizer(other.parameters()), 0).encode()

    sync._snapshot = snapshot


async def _check(liars: int) -> tuple[list[bool], list[torch.nn.Module]]:
    """Replicas 0 and 1 hold the seed-0 stage (the first `liars` of them lie about it), replica 2 the seed-1 stage;
    returns whether each resynchronised, and the modules after the check."""
    async with connected_p2ps(3) as p2ps:
        members = [p2p.peer_id for p2p in p2ps]
        modules = [build_stage(TINY, 0, 2, seed=seed) for seed in (0, 0, 1)]
        syncs = [ReplicaSync(p2p, members, module, StageConfig().build_optimizer(module.parameters()),
                             namespace="rs-test", round_tag="rs-test/v1/stage0", timeout_s=10.0)
                 for p2p, module in zip(p2ps, modules)]
        for sync in syncs[:liars]:
            lie(sync)
        for sync in syncs:
            await sync.attach()
        resynced = await asyncio.gather(*(sync.check(step=7) for sync in syncs))
        return list(resynced), modules


@pytest.mark.swarm
@pytest.mark.timeout(60)
@pytest.mark.parametrize("liars", [0, 1, 2])
def test_a_differing_replica_takes_the_majoritys_state_only_from_a_holder_whose_bytes_have_its_hash(liars):
    resynced, modules = asyncio.run(_check(liars))
    majority = build_stage(TINY, 0, 2, seed=0)
    repaired = liars < 2  # one honest holder of the majority's state is enough
    assert resynced == [False, False, repaired]
    for got, expected, before in zip(modules[2].parameters(), majority.parameters(),
                                     build_stage(TINY, 0, 2, seed=1).parameters()):
        assert torch.equal(got, expected if repaired else before)


def test_the_majority_wins_and_a_tie_goes_by_a_lottery_no_identity_can_rig():
    assert majority_digest({"Qm1": "b", "Qm2": "a", "Qm3": "b"}, salt="s") == "b"
    tie = {"Qm1": "a", "Qm2": "b"}  # Qm1, the lower id, would win every tie by id
    winners = {majority_digest(tie, salt=f"swarm/v1/stage0/replicas after step {step}") for step in range(20)}
    assert winners == {"a", "b"}
    assert majority_digest(tie, salt="x") == majority_digest(dict(reversed(tie.items())), salt="x")  # any order
