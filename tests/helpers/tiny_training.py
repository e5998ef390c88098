"""The tiny model trained by a hand-made plan: its constants, the plan, and a swarm of training processes.

Shared by the training tests (correctness, step faults, compressed training, run-ahead) and by the golden runs
(tests/helpers/golden_runs.py) that the whole-swarm scenarios compare with.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.model import build_full_model, build_stage
from hetswarm.client.training.reference import held_out_loss, reference_step, step_batches
from hetswarm.client.training.stage_state import StageState, unit_digests, unit_encodings, units_root
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.model_config import ModelConfig, get_model_config
from hetswarm.protocol.records import Assignment, PeerRole
from hetswarm.protocol.wire_format import WireFormat
from tests.helpers.dht_nodes import start_node
from tests.helpers.processes import reap_children
from tests.helpers.training_process import Fault, TrainJob, run_training_processes

TINY = get_model_config("tiny", lr_warmup_steps=4)
"""Warming up over its first 4 steps, so that every training scenario (retries, hand-offs, checkpoints, rollbacks)
runs through learning rates that the step number sets, as the single-process references do (set_step_lr)."""
FP32 = WireFormat.uniform("fp32")
"""Exact arithmetic on the wire, so that the distributed step can equal the single-process one."""
SEED = 7
D_PP, D_DP = 2, 2


def assignment_for(pipelines: list[list[str]], coordinator_id: str, wire: WireFormat = FP32,
                   model: ModelConfig = TINY, **runs) -> Assignment:
    """A plan over `pipelines`, cut evenly unless `runs` (stage_layers, recompute, schedule) says otherwise."""
    d_pp = len(pipelines[0])
    runs = {"stage_layers": [list(bounds) for bounds in model.stage_layers(d_pp)]} | runs
    return Assignment(
        coordinator_id=coordinator_id, version=1,
        model={k: v for k, v in model.to_dict().items() if v is not None},  # records carry no nulls
        d_pp=d_pp, d_dp=len(pipelines),
        roles={peer: PeerRole(stage=s, replica=r) for r, chain in enumerate(pipelines) for s, peer in enumerate(chain)},
        pipelines=pipelines, predicted_step_s=0.0, breakdown={}, micro_batches=model.micro_batches, step=0,
        reason="test", issued_at=0.0, wire=wire.to_dict(), **runs,
    )


def second_stage_state(step: int, *, seed: int = 0) -> StageState:
    """The state of stage 1 of 2 of the tiny model (layers 2-3 and the head) after one AdamW step from `seed`:
    different seeds give states that differ in every unit."""
    stage = build_stage(TINY, 1, 2, seed=seed)
    optimizer = StageConfig().build_optimizer(stage.parameters())
    for param in stage.parameters():
        param.grad = torch.ones_like(param)
    optimizer.step()
    return StageState.capture(stage, optimizer, step=step)


def checkpoint_root(state: StageState) -> str:
    """The root a checkpoint of `state` advertises (client/training/checkpoints.py)."""
    return units_root(unit_digests(unit_encodings(state)))


def peer_ids(tmp: Path, count: int) -> tuple[list[Path], list[str]]:
    """The identity files peer0.key … of a run in `tmp` (made on first use, kept when already there), and their ids."""
    identities = [tmp / f"peer{i}.key" for i in range(count)]
    return identities, [peer_id_of(load_identity(path).get_public_key()) for path in identities]


def train_swarm(tmp: Path, *, swarm: str, steps: int, d_pp: int = D_PP, d_dp: int = D_DP, model: ModelConfig = TINY,
                wire: WireFormat = FP32, runs: dict | None = None, faulty: int | None = None,
                fault: Fault = Fault.NONE, timeout_s: float = 150, **job) -> list[dict]:
    """Trains a d_dp × d_pp swarm of separate processes (peer i is stage i mod d_pp of pipeline i div d_pp) for
    `steps` steps, bootstrapped from a DHT node in this process; peer `faulty` misbehaves as `fault` says.
    `job` holds the other TrainJob fields, the same for every peer. Returns each process's results in peer order,
    with "faulty" marking the misbehaving one."""
    identities, ids = peer_ids(tmp, d_pp * d_dp)
    pipelines = [ids[r * d_pp:(r + 1) * d_pp] for r in range(d_dp)]
    bootstrap, key = start_node(swarm, tmp / "bootstrap.key")
    try:
        assignment = assignment_for(pipelines, peer_id_of(key.get_public_key()), wire, model, **(runs or {}))
        initial_peers = [str(maddr) for maddr in bootstrap.get_visible_maddrs()]
        jobs = [TrainJob(swarm=swarm, identity_path=path, initial_peers=initial_peers, assignment=assignment,
                         steps=steps, output_path=tmp / f"peer{i}.pt", torch_threads=1,
                         fault=fault if i == faulty else Fault.NONE, **job)
                for i, path in enumerate(identities)]
        saved = run_training_processes(jobs, timeout_s=timeout_s)
        return [state | {"faulty": i == faulty} for i, state in enumerate(saved)]
    finally:
        bootstrap.shutdown()
        reap_children()


def assert_first_step_is_the_reference(results: list[dict], model: ModelConfig, *, d_pp: int, d_dp: int,
                                       model_dir: Path | None = None, data_path: Path | None = None) -> None:
    """The swarm's first loss and every replica's averaged gradients are reference_step's on the same batch (1e-5)
    of the same data; a model with an init_digest starts from `model_dir`'s weights there too."""
    batches = step_batches(TokenSource.from_path(data_path), model, step=0, n_pipelines=d_dp)
    full = build_full_model(model, seed=SEED)
    if model.init_digest is not None:
        from hetswarm.client.training.hf_folder import load_initial_weights  # transformers, for such models only
        load_initial_weights(full, model_dir)
    reference = reference_step(full, batches)

    last_stage = [r for r in results if r["stage"] == d_pp - 1]
    distributed_loss = sum(r["reports"][0]["loss"] for r in last_stage) / d_dp  # mean over the pipelines
    assert distributed_loss == pytest.approx(reference.loss, abs=1e-5)
    assert all(r["reports"][0]["loss"] is None for r in results if r["stage"] != d_pp - 1)

    checked = set()
    for result in results:  # every replica of every stage holds the averaged gradient
        for name, grad in result["first_grads"].items():
            torch.testing.assert_close(grad, reference.grads[name], rtol=1e-5, atol=1e-5, msg=name)
            checked.add(name)
    assert checked == set(reference.grads)


def assert_held_out_is_the_models(results: list[dict], model: ModelConfig, states: list[dict[str, torch.Tensor]], *,
                                  step: int, d_pp: int, d_dp: int) -> None:
    """Every pipeline's held-out loss after `step` is the one of the model its stages hold then (`states`, in
    peer order, assembled into one model), on the same held-out windows (1e-5), and the pipelines agree bit for
    bit; no other stage reports one."""
    whole = build_full_model(model, seed=SEED)
    held = {name: value for state in states for name, value in state.items()}
    with torch.no_grad():
        for name, param in whole.named_parameters():
            param.copy_(held[name])
    expected = held_out_loss(whole, TokenSource.from_path(None), model, n_pipelines=d_dp)
    reported = [r["reports"][step]["held_out_loss"] for r in results if r["stage"] == d_pp - 1]
    assert len(reported) == d_dp and len(set(reported)) == 1, reported
    assert reported[0] == pytest.approx(expected, abs=1e-5)
    assert all(r["reports"][step]["held_out_loss"] is None for r in results if r["stage"] != d_pp - 1)
