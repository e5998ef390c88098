"""With 8-bit activations, activation gradients and all-reduce, steps stay all-or-nothing and replicas identical.

The 4-process swarm of tests/test_step_faults.py (2 stages × 2 replicas of the tiny model) trains under a plan whose
wire is 8-bit everywhere, once without faults and once with a one-sided partial all-reduce at a chosen step: the
round completed, so its error-feedback residuals were made, but the step is retried by the whole plan. The retry must
start again from the residuals the step started from (client/training/error_feedback.py), so the final parameters
of the faulty run equal the fault-free run's. The replicas' state hashes are compared every second step, and they
must never have had to resync. Compressed training stays near the fp32 reference.

With activation deltas (AQ-SGD) and a data order that repeats every 2 steps, the first pass is sent whole and the
next two as 4-bit deltas; a send that fails after delivery at step 2 (a delta) makes the plan retry the step, and the
retry must start from the same activation copies, so that the run again equals its fault-free twin. The wire is
`aq-powersgd`'s, the lightest: the deltas with 4-bit activation gradients and a low-rank all-reduce on top. Its
gradients are rounded at random, each frame by its place in the run, so the retry rounds them as the first try did.

With a codec per hop and per stage group (`auto`'s per-link wire), the replicas stay identical.

With a sparse all-reduce (a random 1/16 of the gradient per step, protocol/wire_format.py), the retried step draws the
same sample and starts from the same residuals, so the run with the fault again equals its twin. So does a low-rank
all-reduce (PowerSGD), whose retried step also starts from the factor its first try started from.
"""
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.protocol.wire_format import LOW_RANK_SHARE, SPARSE_DENSITY, WireFormat
from tests.helpers.fault_runs import FAULT_STEP, STEPS, run_with_fault
from tests.helpers.golden_runs import states
from tests.helpers.tiny_training import D_DP, D_PP, TINY
from tests.helpers.training_process import Fault

pytestmark = pytest.mark.swarm

EIGHT_BIT = WireFormat.uniform("8bit")
AQ_POWERSGD = WireFormat(activations="8bit", gradients="4bit", allreduce="8bit", activation_deltas="4bit",
                         allreduce_low_rank=LOW_RANK_SHARE)
"""The `aq-powersgd` policy's wire: aq-sgd's deltas, with 4-bit activation gradients and a low-rank all-reduce."""
SPARSE = WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", allreduce_density=SPARSE_DENSITY)
LOW_RANK = WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", allreduce_low_rank=LOW_RANK_SHARE)
PER_LINK = WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", hops=(("fp32", "8bit"),),
                      groups=("8bit", "fp32"))
"""`auto`'s kind of wire: pipeline 0's hop exact and pipeline 1's 8-bit; stage 0's all-reduce 8-bit, stage 1's exact."""
PERIOD = 2


@pytest.fixture(scope="module")
def identities(tmp_path_factory) -> Path:
    """One set of peer identities for every run: a stage group's members split the all-reduce in peer-id order,
    and under a lossy codec a reducer's own part travels exactly while the others' are quantized."""
    folder = tmp_path_factory.mktemp("identities")
    for i in range(D_PP * D_DP):
        load_identity(folder / f"peer{i}.key")
    return folder


def _run(tmp: Path, identities: Path, fault: Fault, wire: WireFormat, data_period: int | None = None) -> list[dict]:
    tmp.mkdir(exist_ok=True)
    for key in identities.glob("peer*.key"):
        shutil.copy(key, tmp / key.name)
    return run_with_fault(tmp, fault, wire, replace(TINY, data_period=data_period))


def _assert_replicas_identical(results: list[dict]) -> None:
    for result in results:
        reports = result["reports"]
        assert [report["step"] for report in reports] == list(range(STEPS)), reports
        assert reports[-1]["resyncs"] == 0, reports[-1]  # the replica checks never found a difference
    for stage in range(D_PP):
        replicas = [r["final_state"] for r in results if r["stage"] == stage]
        for name, value in replicas[0].items():
            assert all(torch.equal(value, other[name]) for other in replicas[1:]), f"stage {stage}: {name}"


def _assert_equal_runs(results: list[dict], expected: list[dict]) -> None:
    for result, twin in zip(results, expected):
        for name, value in result["final_state"].items():
            torch.testing.assert_close(value, twin["final_state"][name], rtol=0, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory, identities) -> list[dict]:
    return _run(tmp_path_factory.mktemp("8bit-fault-free"), identities, Fault.NONE, EIGHT_BIT)


@pytest.mark.timeout(300)
def test_8bit_replicas_stay_identical_and_a_retried_step_equals_the_fault_free_run(tmp_path, identities, fault_free):
    faulty = _run(tmp_path, identities, Fault.ONE_SIDED_PARTIAL_ALLREDUCE, EIGHT_BIT)
    for results in (fault_free, faulty):
        _assert_replicas_identical(results)
    assert any(r["reports"][FAULT_STEP]["attempt"] >= 1 for r in faulty)  # the fault step was retried
    _assert_equal_runs(faulty, fault_free)


@pytest.mark.timeout(300)
def test_activation_deltas_after_the_first_pass_and_a_retried_delta_step_equals_the_fault_free_run(
        tmp_path, identities):
    fault_free = _run(tmp_path / "fault-free", identities, Fault.NONE, AQ_POWERSGD, data_period=PERIOD)
    faulty = _run(tmp_path / "faulty", identities, Fault.SEND_FAILS_AFTER_DELIVERY, AQ_POWERSGD, data_period=PERIOD)
    micro_batches = TINY.micro_batches
    for results in (fault_free, faulty):
        _assert_replicas_identical(results)
        for result in results:  # stage 0 sends, stage 1 takes: the first pass whole, every later step as deltas
            end = "deltas_sent" if result["stage"] == 0 else "deltas_taken"
            whole, deltas = result[end]
            assert whole >= PERIOD * micro_batches and deltas >= (STEPS - PERIOD) * micro_batches, result[end]
    assert any(r["reports"][FAULT_STEP]["attempt"] >= 1 for r in faulty)  # the delta step was retried
    _assert_equal_runs(faulty, fault_free)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("wire", [SPARSE, LOW_RANK], ids=["sparse", "low-rank"])
def test_a_sampled_or_low_rank_all_reduce_keeps_replicas_identical_and_a_retry_equals_the_fault_free_run(
        tmp_path, identities, fault_free, wire):
    """A retried step draws the sample its first try drew, or starts from the factor its first try started from."""
    fault_free_run = _run(tmp_path / "fault-free", identities, Fault.NONE, wire)
    faulty = _run(tmp_path / "faulty", identities, Fault.ONE_SIDED_PARTIAL_ALLREDUCE, wire)
    for results in (fault_free_run, faulty):
        _assert_replicas_identical(results)
    assert any(r["reports"][FAULT_STEP]["attempt"] >= 1 for r in faulty)  # the fault step was retried
    _assert_equal_runs(faulty, fault_free_run)
    moved = max(float((value - dense["final_state"][name]).abs().max())
                for result, dense in zip(fault_free_run, fault_free) for name, value in result["final_state"].items())
    assert moved > 1e-4  # the sample or the factors reached the stage groups: unlike the dense 8-bit run's updates


@pytest.mark.timeout(300)
def test_per_link_codecs_keep_replicas_identical(tmp_path, identities, fault_free, golden_tiny):
    """Each hop and each stage group in its own codec: both ends of every transfer agree on it (a frame or part in
    another codec is refused, and the run would stall), and the replicas stay identical though their pipelines'
    activations crossed in different codecs."""
    per_link = _run(tmp_path, identities, Fault.NONE, PER_LINK)
    _assert_replicas_identical(per_link)
    eight_bit, fp32 = [result["final_state"] for result in fault_free], states(golden_tiny, STEPS)
    for uniform in (eight_bit, fp32):  # a run of its own: neither 8-bit everywhere nor fp32 everywhere
        moved = max(float((value - twin[name]).abs().max())
                    for result, twin in zip(per_link, uniform) for name, value in result["final_state"].items())
        assert moved > 1e-6


@pytest.mark.timeout(300)
def test_8bit_training_stays_near_fp32(fault_free, golden_tiny):
    """Against the same swarm with fp32 on the wire: the session's golden run (tests/helpers/golden_runs.py)."""
    for result, reference in zip(fault_free, states(golden_tiny, STEPS)):
        for name, value in result["final_state"].items():
            moved = float((reference[name] - value).abs().max())
            assert moved < 2e-2, f"{name} is {moved:.2g} from the fp32 run's"  # AdamW's steps are ~lr = 3e-3
