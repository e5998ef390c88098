"""A single-stage plan computes the next step while it votes on this one, and puts a step back that the plan aborts.

Two training processes, one stage × two replicas of the tiny model (fp32 on CPU), as in tests/test_step_faults.py.
In one run the replicas never run ahead and nothing goes wrong. In the other they run ahead, and at FAULT_STEP one
replica reports its all-reduce partial a second after it completed (Fault.LATE_FAILURE): the other has voted success
and applied the step by then, and must put it back. Both runs must end with the same parameters, bit for bit: the
passes computed ahead are the passes of the step run in turn, and the rollback restores the state exactly.
"""
import pytest
import torch

from tests.helpers.fault_runs import CONFIG, FAULT_STEP, STEPS, run_with_fault
from tests.helpers.processes import reap_children
from tests.helpers.training_process import Fault

pytestmark = pytest.mark.swarm


@pytest.fixture(scope="module")
def in_turn(tmp_path_factory) -> list[dict]:
    """Every step run in turn, no fault."""
    return run_with_fault(tmp_path_factory.mktemp("in-turn"), Fault.NONE, d_pp=1, d_dp=2, run_ahead=False)


@pytest.mark.timeout(200)
def test_running_ahead_and_putting_an_aborted_step_back_changes_no_parameter(tmp_path, in_turn):
    ahead = run_with_fault(tmp_path, Fault.LATE_FAILURE, d_pp=1, d_dp=2)
    reap_children()

    assert CONFIG.check_every == 2 and FAULT_STEP == 2 and STEPS == 6  # the schedule the expectations below follow
    for result in ahead:
        reports = result["reports"]
        assert [report["step"] for report in reports] == list(range(STEPS)), reports
        assert reports[FAULT_STEP]["attempt"] == 1, reports
        # Steps after which the replicas are checked never run ahead (0: the plan's first; 1, 3, 5: every second;
        # 2: retried), so step 3 was computed ahead at step 2's attempt 0 and dropped, and step 5 is the only one
        # whose passes were computed ahead and used.
        assert [report["computed_ahead"] for report in reports] == [False] * 5 + [True], reports
        # The replica that failed the step voted failure, so it never applied it; the other one did, and put it back.
        assert reports[-1]["rollbacks"] == (0 if result["faulty"] else 1), reports[-1]
    assert not any(report["computed_ahead"] or report["rollbacks"] for result in in_turn
                   for report in result["reports"])

    for result, expected in zip(ahead, in_turn):
        for name, value in result["final_state"].items():
            assert torch.equal(value, expected["final_state"][name]), name
