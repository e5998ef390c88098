"""A step that fails anywhere is retried by the whole plan, never skipped or applied twice, and replicas that
drift apart are put back in line.

Four training processes (2 stages × 2 replicas of the tiny model, fp32 on CPU), as in
tests/test_training_correctness.py. One of them misbehaves once, at a chosen step, in the way its ``Fault`` says
(tests/helpers/training_process.py). After STEPS steps every replica of every stage must hold the parameters of
the single-process reference trained on the same data for the same steps, every process must report each step
exactly once, and the retries and resyncs must show in the reports. Final parameters are compared (atol 1e-5) with
a fault-free run of the same swarm: the single-process reference differs from any distributed run by summation
order, which AdamW amplifies on near-zero gradients beyond 1e-5 within a few steps, so it is checked loosely.
"""
from pathlib import Path

import pytest
import torch
from hivemind.p2p import PeerID

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.reference import reference_step, step_batches
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.identity import load_identity, peer_id_of
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.wire_format import WireFormat
from tests.conftest import reap_children
from tests.helpers.dht_nodes import start_node
from tests.helpers.training_process import Fault, TrainJob, run_training_processes
from tests.test_training_correctness import D_DP, D_PP, FP32, SEED, TINY, _assignment

SWARM = "faults"
STEPS = 6
FAULT_STEP, FAULT_MICRO_BATCH = 2, 1
DIVERGE_STEP = 3
"""Replicas compare states after steps 1, 3 and 5 (check_every=2): the corruption is caught before step 4."""
CONFIG = StageConfig(lr=3e-3, frame_timeout_s=8, sender_timeout_s=10, reducer_timeout_s=20, start_timeout_s=60,
                     commit_timeout_s=30, max_attempts=3, check_every=2)

RETRIED = {Fault.SEND_FAILS_AFTER_DELIVERY, Fault.FRAME_DROPPED, Fault.ONE_SIDED_PARTIAL_ALLREDUCE}
"""Faults after which the whole plan must retry the fault step once."""


def _run_swarm(tmp: Path, fault: Fault, wire: WireFormat = FP32, model: ModelConfig = TINY, *, d_pp: int = D_PP,
               d_dp: int = D_DP, run_ahead: bool = True) -> list[dict]:
    """Runs the d_dp × d_pp swarm with ``fault`` in one process (and the plan's codecs `wire`, fp32 by default, and
    its `model`); returns each process's results in peer order."""
    identities = [tmp / f"peer{i}.key" for i in range(d_pp * d_dp)]
    peer_ids = [peer_id_of(load_identity(path).get_public_key()) for path in identities]
    pipelines = [peer_ids[r * d_pp:(r + 1) * d_pp] for r in range(d_dp)]
    if fault is Fault.REPLICA_DIVERGES:  # the replica that is not the reference copy: the higher peer id of stage 0
        stage0 = [chain[0] for chain in pipelines]
        faulty = peer_ids.index(max(stage0, key=lambda peer: load_peer_bytes(peer)))
    else:
        faulty = 0  # stage 0 of pipeline 0: its activations, or its stage group's all-reduce
    bootstrap, key = start_node(SWARM, tmp / "bootstrap.key")
    try:
        assignment = _assignment(pipelines, peer_id_of(key.get_public_key()), wire, model)
        initial_peers = [str(maddr) for maddr in bootstrap.get_visible_maddrs()]
        jobs = [TrainJob(swarm=SWARM, identity_path=path, initial_peers=initial_peers, assignment=assignment,
                         steps=STEPS, seed=SEED, output_path=tmp / f"peer{i}.pt", config=CONFIG, torch_threads=1,
                         save_final_state=True, fault=fault if i == faulty else Fault.NONE, run_ahead=run_ahead,
                         fault_at=(DIVERGE_STEP if fault is Fault.REPLICA_DIVERGES else FAULT_STEP,
                                   FAULT_MICRO_BATCH))
                for i, path in enumerate(identities)]
        saved = run_training_processes(jobs, timeout_s=100)
        return [state | {"faulty": i == faulty} for i, state in enumerate(saved)]
    finally:
        bootstrap.shutdown()
        reap_children()


def load_peer_bytes(peer: str) -> bytes:
    return PeerID.from_base58(peer).to_bytes()


@pytest.fixture(scope="module")
def fault_free_state(tmp_path_factory) -> list[dict[str, torch.Tensor]]:
    """Final parameters of every process of a run without faults, in peer order."""
    return [r["final_state"] for r in _run_swarm(tmp_path_factory.mktemp("fault-free"), Fault.NONE)]


@pytest.fixture(scope="module")
def reference_state() -> dict[str, torch.Tensor]:
    """The single-process model after STEPS steps on the swarm's data."""
    model, source = build_full_model(TINY, seed=SEED), TokenSource.from_path(None)
    optimizer = CONFIG.build_optimizer(model.parameters())
    for step in range(STEPS):
        reference_step(model, step_batches(source, TINY, step=step, n_pipelines=D_DP))
        optimizer.step()
    return {name: param.detach().clone() for name, param in model.named_parameters()}


@pytest.mark.timeout(200)  # the first test also runs the fault-free swarm (module fixture)
@pytest.mark.parametrize("fault", [fault for fault in Fault if fault is not Fault.LATE_FAILURE],
                         ids=lambda fault: fault.name.lower())  # tests/test_run_ahead.py has the late failure
def test_a_fault_at_one_step_leaves_every_replica_on_the_fault_free_trajectory(tmp_path, fault, fault_free_state,
                                                                               reference_state):
    results = _run_swarm(tmp_path, fault) if fault is not Fault.NONE else None
    if results is None:  # the fault-free run itself: check it against the single-process reference, loosely
        results = _run_swarm(tmp_path, Fault.NONE)

    for result in results:  # every step once, in order; the fault step retried, and every retry counted
        reports = result["reports"]
        assert [report["step"] for report in reports] == list(range(STEPS)), reports
        attempts = [report["attempt"] for report in reports]
        # A genuine transient fault (a partial all-reduce on this loaded 2-core box, seen in CI) is retried too, and
        # correctly: so other steps may show a retry, and the equality checks below must hold all the same.
        assert attempts[FAULT_STEP] >= (1 if fault in RETRIED else 0), attempts
        assert reports[-1]["retries"] == sum(attempts), (reports[-1], attempts)
        diverged = fault is Fault.REPLICA_DIVERGES and result["faulty"]
        assert reports[-1]["resyncs"] == (1 if diverged else 0), reports[-1]

    for stage in range(D_PP):  # replicas agree bit for bit
        replicas = [r["final_state"] for r in results if r["stage"] == stage]
        for name, value in replicas[0].items():
            for other in replicas[1:]:
                assert torch.equal(value, other[name]), f"stage {stage} replicas differ in {name}"
                torch.testing.assert_close(value, reference_state[name], rtol=0, atol=2e-3, msg=name)
    for result, expected in zip(results, fault_free_state):  # and equal the fault-free run
        for name, value in result["final_state"].items():
            torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-5, msg=name)
