"""This peer's stage of a plan, built and serving: its module (from the seed, or a Hugging Face folder's weights), its
neighbour streams, its stage group, the plan's commit board, its replica check, and the worker that runs its steps
(client/training/stage_worker.py). A stage starts once every peer it exchanges with answers.
"""
import asyncio
import logging
from pathlib import Path

import torch
from hivemind.p2p import P2P, PeerID
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.training.activation_deltas import buffer_bytes
from hetswarm.client.training.data import TokenSource, sequences_per_micro_batch
from hetswarm.client.training.errors import StageError
from hetswarm.client.training.group_allreduce import StageGroup
from hetswarm.client.training.model import StageModule, build_stage
from hetswarm.client.training.neighbour_streams import LinkObserver, NeighbourStreams, StreamPlan
from hetswarm.client.training.replica_sync import ReplicaSync
from hetswarm.client.training.stage_passes import StagePasses
from hetswarm.client.training.stage_worker import StageConfig, StageWorker
from hetswarm.client.training.step_commit import CommitBoard
from hetswarm.client.training.tied_embeddings import TiedMatrix
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import (
    allreduce_namespace,
    commit_namespace,
    replica_namespace,
    round_tag,
    stage_namespace,
)
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.stage_role import StageRole

__all__ = ["check_data", "check_deltas", "start_stage"]

logger = logging.getLogger(__name__)


def _eval_every(role: StageRole, data: TokenSource) -> int:
    """The plan's evaluation period, or 0 when the data has no usable held-out split (every peer's data is the
    plan's, so every stage of the pipeline decides alike)."""
    problem = data.held_out_problem(role.model.seq_len) if role.eval_every else None
    if problem is not None:
        logger.warning(f"Plan v{role.version} asks for a held-out loss every {role.eval_every} steps, "
                       f"but {problem}: none measured")
        return 0
    return role.eval_every


async def start_stage(
    role: StageRole, identity: RSAPrivateKey, *, p2p: P2P, swarm: str, device: torch.device | str,
    data: TokenSource, seed: int, config: StageConfig = StageConfig(), emulated_tflops: float | None = None,
    model_dir: Path | None = None, on_sent: LinkObserver | None = None,
) -> StageWorker:
    """Builds this peer's stage of the plan (`role`, protocol/stage_role.py), serving its neighbour streams and its
    group, once all its peers answer.

    `identity` is this peer's key (``p2p``'s peer id is its, and `role`'s): it signs the peer's commit votes. Every
    peer of the swarm must pass the same ``swarm``, ``data``, ``seed`` and ``config``: replicas start from identical
    weights and the two ends of a pipeline draw the same micro-batches. A model that starts from a Hugging Face
    folder's weights (ModelConfig.init_digest) takes them from ``model_dir``, this peer's copy. ``on_sent`` hears
    of every frame this stage delivers (client/training/neighbour_streams.py).

    Raises:
        StageError: ``identity`` is not the role's peer, its peers did not come up in time, ``data`` is not
            the plan's, or ``model_dir`` is not the folder the plan's model starts from.
    """
    if (me := peer_id_of(identity.get_public_key())) != role.peer_id:
        raise StageError(f"this peer is {me}, the role is {role.peer_id}'s")
    device, model_config = torch.device(device), role.model
    module = build_stage(model_config, role.stage, role.d_pp, seed=seed, device=device,
                         stage_layers=list(role.stage_layers),  # only its layers, cut as the plan says
                         recompute=role.recompute)
    check_data(model_config, data)
    if model_config.init_digest is not None:
        await _load_initial_weights(module, model_dir)

    previous, following = (PeerID.from_base58(peer) if peer else None for peer in role.neighbours)
    plan = StreamPlan(assignment_version=role.version, pipeline=role.pipeline, stage=role.stage,
                      micro_batches=model_config.micro_batches,
                      wire=role.wire, previous=previous, next=following,
                      shape=(sequences_per_micro_batch(model_config, role.d_dp), model_config.seq_len,
                             model_config.d_model), data_period=model_config.data_period)
    if role.wire.activation_deltas:
        check_deltas(plan, config)
    streams = NeighbourStreams(p2p, plan, namespace=stage_namespace(swarm), frame_timeout_s=config.frame_timeout_s,
                               on_sent=on_sent)
    members = [PeerID.from_base58(peer) for peer in role.group]  # stage replicas
    tag = round_tag(swarm, role.version, role.stage)
    group = StageGroup(p2p, members, namespace=allreduce_namespace(swarm, role.stage), round_tag=tag,
                       sender_timeout_s=config.sender_timeout_s, reducer_timeout_s=config.reducer_timeout_s,
                       aggregation=role.aggregation, codec=role.wire.group_codec(role.stage),
                       density=role.wire.allreduce_density, low_rank=role.wire.allreduce_low_rank,
                       private_key=identity)

    everyone = [PeerID.from_base58(peer) for peer in role.members]
    board = CommitBoard(p2p, everyone, namespace=commit_namespace(swarm, role.version), private_key=identity)
    tied = TiedMatrix.of_role(module, role, p2p=p2p, swarm=swarm, sender_timeout_s=config.sender_timeout_s,
                              reducer_timeout_s=config.reducer_timeout_s)
    optimizer = config.build_optimizer(module.parameters())
    replicas = ReplicaSync(p2p, members, module, optimizer, namespace=replica_namespace(swarm, role.stage),
                           round_tag=tag, timeout_s=config.commit_timeout_s)

    streams.advance_to(role.first_step)  # a plan that starts mid-training takes frames of its first step at once
    passes = StagePasses(module, role, streams=streams, data=data, device=device, emulated_tflops=emulated_tflops)
    worker = StageWorker(passes, group=group, board=board, replicas=replicas, config=config, optimizer=optimizer,
                         eval_every=_eval_every(role, data), tied=tied)
    try:
        await board.attach()  # before the streams: a peer that answers a ping serves every handler
        await replicas.attach()
        await group.attach()
        if tied is not None:
            await tied.attach()
        await streams.attach()
        await streams.wait_for([peer for peer in (previous, following, *members, *(tied.members if tied else ()))
                                if peer], config.start_timeout_s)
    except BaseException:  # its handler names must be free for the next plan's worker
        await worker.close()
        raise
    return worker


def check_data(model: ModelConfig, data: TokenSource) -> None:
    """Raises StageError when this peer's data is not the plan's, or holds tokens beyond the model's vocabulary."""
    if data.vocab_size > model.vocab_size:
        raise StageError(f"this peer's data has a vocabulary of {data.vocab_size}, more than the {model.vocab_size} "
                         f"tokens of the plan's model {model.name!r}")
    if model.data_digest is not None and data.digest != model.data_digest:
        raise StageError(f"this peer's --data has SHA-256 {data.digest}, the plan trains on data with SHA-256 "
                         f"{model.data_digest}: another corpus, or another preparation of it")


async def _load_initial_weights(module: StageModule, model_dir: Path | None) -> None:
    """The folder's tensors of this stage, read in a worker thread (hashing a large folder takes seconds)."""
    from hetswarm.client.training.hf_folder import load_initial_weights  # transformers: only for such models

    try:
        await asyncio.to_thread(load_initial_weights, module, model_dir)
    except ConfigError as e:
        raise StageError(f"cannot start from the plan's initial weights: {e}") from e


def check_deltas(plan: StreamPlan, config: StageConfig) -> None:
    """Activation deltas need samples that recur, and room for a pass of activation copies. The period must be at
    least 2 steps: a neighbour may send a frame of the next step before this stage commits the current one, so the
    two steps must not share samples (whose copies the commit is about to change).

    Raises:
        StageError: the plan's model has no data period (or one of a single step), or a pass of activation copies
            would take more than ``config.max_delta_bytes``.
    """
    if plan.data_period is None or plan.data_period < 2:
        raise StageError(f"activation deltas need a model data_period of at least 2 steps (samples that recur), "
                         f"got {plan.data_period}")
    need = buffer_bytes(data_period=plan.data_period, micro_batches=plan.micro_batches, shape=plan.shape)
    if need > config.max_delta_bytes:
        raise StageError(f"activation deltas keep {plan.data_period} steps × {plan.micro_batches} micro-batches of "
                         f"{list(plan.shape)} activations at each end of a link: {need / 2**20:.0f} MiB, over the "
                         f"limit of {config.max_delta_bytes / 2**20:.0f} MiB; shorten the data period or raise "
                         f"the limit")
