"""`hetswarm export`: the newest step a swarm's checkpoints, or its live members, hold whole, as a Hugging Face
model folder."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hetswarm.client.cli import processes
from hetswarm.client.cli.options import CoordinatorOpt, InitialPeersOpt, SwarmOpt, console
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.assignment_follower import check_coordinator_id
from hetswarm.client.peer.node import DEFAULT_SWARM, NodeConfig
from hetswarm.client.training.checkpoints import CheckpointDir, newest_whole_model
from hetswarm.protocol.errors import ConfigError, HetswarmError


def export(
    out: Annotated[Path, typer.Option("--out", help="The folder to write; it must not exist yet.")],
    checkpoint_dirs: Annotated[list[Path], typer.Option(
        "--checkpoint-dir", help="A peer's --checkpoint-dir; repeat it for the peers whose stages make the model.")
    ] = [],
    initial_peers: InitialPeersOpt = [],
    coordinator: CoordinatorOpt = None,
    swarm: SwarmOpt = DEFAULT_SWARM,
    data: Annotated[Optional[Path], typer.Option(help="The prepared data the model was trained on (hetswarm data "
                                                      "prepare): its tokenizer goes into the folder.")] = None,
) -> None:
    """Assemble the newest step that every layer has, in the checkpoints or (with --initial-peers and
    --coordinator) in the plan's live members, into a folder that transformers' AutoModelForCausalLM.from_pretrained
    loads (config.json, generation_config.json, model.safetensors)."""
    from hetswarm.client.training.hf_folder import export_folder  # transformers: only this command pays for it
    from hetswarm.client.training.prepared_data import PreparedData

    if bool(checkpoint_dirs) == bool(initial_peers) or bool(initial_peers) != bool(coordinator):
        raise HetswarmError("give --checkpoint-dir folders, or --initial-peers and --coordinator of a live swarm")
    if checkpoint_dirs:
        model, state = newest_whole_model([CheckpointDir(folder, swarm) for folder in checkpoint_dirs])
    else:
        node_config = NodeConfig(swarm=swarm, initial_peers=tuple(initial_peers), host_maddrs=(LOOPBACK,),
                                 client_mode=True)
        model, state = processes.fetch_live_model(node_config, check_coordinator_id(coordinator), timeout_s=60.0)
    prepared = None if data is None else PreparedData.open(data)
    if prepared is not None and prepared.digest != (model.data_digest or prepared.digest):
        raise ConfigError(f"--data {data} has digest {prepared.digest}; the checkpoints were trained on "
                          f"{model.data_digest}")
    export_folder(model, state.tensors, out, prepared)  # the parameters; AdamW's moments stay out
    console.print(f"Exported {model.name} ({model.architecture}, {model.total_params:,} parameters) at step "
                  f"{state.step} to {out}")
