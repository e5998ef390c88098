"""A step that fails anywhere is retried by the whole plan, never skipped or applied twice, and replicas that
drift apart are put back in line.

Four training processes (2 stages × 2 replicas of the tiny model, fp32 on CPU), as in
tests/test_training_correctness.py. One of them misbehaves once, at a chosen step, in the way its ``Fault`` says
(tests/helpers/training_process.py). After STEPS steps every replica of every stage must hold the parameters of
the single-process reference trained on the same data for the same steps, every process must report each step
exactly once, and the retries and resyncs must show in the reports. Final parameters are compared (atol 1e-5) with
a fault-free run of the same swarm (the session's golden run, tests/helpers/golden_runs.py): the single-process reference differs from any distributed run by summation
order, which AdamW amplifies on near-zero gradients beyond 1e-5 within a few steps, so it is checked loosely.
"""
import pytest
import torch

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.reference import reference_step, step_batches
from tests.helpers.fault_runs import CONFIG, FAULT_STEP, STEPS, run_with_fault
from tests.helpers.golden_runs import TINY_RUN, states
from tests.helpers.tiny_training import D_DP, D_PP, SEED, TINY
from tests.helpers.training_process import HOSTILE_REDUCER_SCALES, Fault

pytestmark = pytest.mark.swarm

RETRIED = {Fault.SEND_FAILS_AFTER_DELIVERY, Fault.FRAME_DROPPED, Fault.ONE_SIDED_PARTIAL_ALLREDUCE}
"""Faults after which the whole plan must retry the fault step once."""
ONE_OFF = [fault for fault in Fault if fault is not Fault.LATE_FAILURE and fault not in HOSTILE_REDUCER_SCALES]
"""The faults tested here; the late failure is tests/test_run_ahead.py's, and a hostile reducer's averages (at every
step) tests/test_attack_votes.py's."""
assert TINY_RUN.config == CONFIG and STEPS in TINY_RUN.states_after  # the golden run is this swarm without faults


@pytest.fixture(scope="module")
def fault_free(golden_tiny) -> list[dict]:
    """The first STEPS steps of the session's golden run: this swarm without faults (reports and parameters)."""
    return [result | {"reports": result["reports"][:STEPS], "final_state": state, "faulty": False}
            for result, state in zip(golden_tiny, states(golden_tiny, STEPS))]


@pytest.fixture(scope="module")
def reference_state() -> dict[str, torch.Tensor]:
    """The single-process model after STEPS steps on the swarm's data."""
    model, source = build_full_model(TINY, seed=SEED), TokenSource.from_path(None)
    optimizer = CONFIG.build_optimizer(model.parameters())
    for step in range(STEPS):
        reference_step(model, step_batches(source, TINY, step=step, n_pipelines=D_DP))
        CONFIG.set_step_lr(optimizer, TINY, step)
        optimizer.step()
    return {name: param.detach().clone() for name, param in model.named_parameters()}


@pytest.mark.timeout(200)  # the first test may also train the golden run
@pytest.mark.parametrize("fault", ONE_OFF, ids=lambda fault: fault.name.lower())
def test_a_fault_at_one_step_leaves_every_replica_on_the_fault_free_trajectory(tmp_path, fault, fault_free,
                                                                               reference_state):
    # Fault.NONE checks the fault-free run itself: against the single-process reference, loosely
    results = run_with_fault(tmp_path, fault) if fault is not Fault.NONE else fault_free

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
    for result, expected in zip(results, fault_free):  # and equal the fault-free run
        for name, value in result["final_state"].items():
            torch.testing.assert_close(value, expected["final_state"][name], rtol=0, atol=1e-5, msg=name)
