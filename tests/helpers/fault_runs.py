"""The tiny swarm with one fault injected at a chosen step: the runs of tests/test_step_faults.py,
tests/test_run_ahead.py and tests/test_compressed_training.py."""
from __future__ import annotations

from pathlib import Path

from hetswarm.client.training.replica_sync import check_salt
from hetswarm.client.training.stage_state import majority_digest
from hetswarm.protocol.keys import round_tag
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.wire_format import WireFormat
from tests.helpers.golden_runs import LR3_CONFIG
from tests.helpers.tiny_training import D_DP, D_PP, FP32, SEED, TINY, peer_ids, train_swarm
from tests.helpers.training_process import Fault

STEPS = 6
FAULT_STEP, FAULT_MICRO_BATCH = 2, 1
DIVERGE_STEP = 3
"""Replicas compare states after steps 1, 3 and 5 (check_every=2): the corruption is caught before step 4."""
CONFIG = LR3_CONFIG
SWARM = "faults"


def run_with_fault(tmp: Path, fault: Fault, wire: WireFormat = FP32, model: ModelConfig = TINY, *, d_pp: int = D_PP,
                   d_dp: int = D_DP, run_ahead: bool = True) -> list[dict]:
    """Runs the d_dp × d_pp swarm for STEPS steps with ``fault`` in one process (and the plan's codecs `wire`, fp32
    by default, and its `model`); returns each process's results in peer order."""
    if fault is Fault.REPLICA_DIVERGES:  # a stage-0 replica that the check's tie-break does not take as reference
        _, ids = peer_ids(tmp, d_pp * d_dp)
        replicas = {ids[i]: i for i in range(0, d_pp * d_dp, d_pp)}
        reference = majority_digest(replicas, salt=check_salt(round_tag(SWARM, 1, 0), DIVERGE_STEP))
        faulty = next(i for i in replicas.values() if i != reference)
    else:
        faulty = 0  # stage 0 of pipeline 0: its activations, or its stage group's all-reduce
    fault_at = (DIVERGE_STEP if fault is Fault.REPLICA_DIVERGES else FAULT_STEP, FAULT_MICRO_BATCH)
    return train_swarm(tmp, swarm=SWARM, steps=STEPS, d_pp=d_pp, d_dp=d_dp, model=model, wire=wire,
                       faulty=faulty, fault=fault, timeout_s=100, seed=SEED, config=CONFIG, save_final_state=True,
                       run_ahead=run_ahead, fault_at=fault_at)
