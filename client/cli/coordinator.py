"""`hetswarm coordinator`: the peer that schedules the swarm and broadcasts signed stage assignments."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from hetswarm.client.cli.options import (
    AnnounceMaddrsOpt,
    HostMaddrsOpt,
    IdentityPathOpt,
    InitialPeersOpt,
    LogFormatOpt,
    MetricsHostOpt,
    MetricsPortOpt,
    SwarmOpt,
    VerboseOpt,
    configure_logging,
    metrics_address,
)
from hetswarm.client.cli.processes import ExportPlan, run_coordinator
from hetswarm.client.peer.addresses import ANY_HOST, DEFAULT_METRICS_HOST
from hetswarm.client.peer.node import DEFAULT_SWARM, NodeConfig
from hetswarm.coordinator.admission import load_allow_list
from hetswarm.coordinator.broadcaster import BroadcastConfig
from hetswarm.coordinator.planner import PlannerConfig
from hetswarm.coordinator.run_state import state_path_for
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.protocol.errors import ConfigError, HetswarmError, RejectedInput
from hetswarm.protocol.model_config import MODEL_PRESETS, ModelConfig, load_model_config


def coordinator(
    initial_peers: InitialPeersOpt = [],
    new_swarm: Annotated[bool, typer.Option("--new-swarm", help="Start a new swarm: this coordinator is its first "
                                                                 "peer.")] = False,
    host_maddrs: HostMaddrsOpt = [ANY_HOST],
    announce_maddrs: AnnounceMaddrsOpt = [],
    identity_path: IdentityPathOpt = None,
    swarm: SwarmOpt = DEFAULT_SWARM,
    model: Annotated[str, typer.Option(help=f"Model preset ({', '.join(MODEL_PRESETS)}), a JSON file of its fields, "
                                            "or a Hugging Face Llama or GPT-2 folder (or its config.json), whose "
                                            "shape is trained from the seed.")] = "tiny",
    init_from: Annotated[Optional[Path], typer.Option(help="Start the model from this Hugging Face folder's "
                                                           "weights (its shape must be --model's): the plan names "
                                                           "them by SHA-256, and every peer loads its stage from "
                                                           "its own copy (hetswarm join --model-dir).")] = None,
    data: Annotated[Optional[Path], typer.Option(help="Pin the plan to this data (a text file or folder, or a "
                                                     "folder of `hetswarm data prepare`): a peer whose --data "
                                                     "differs refuses the plan.")] = None,
    dp: Annotated[str, typer.Option("--dp", help="D_DP, pipelines: a number or auto.")] = "auto",
    pp: Annotated[str, typer.Option("--pp", help="D_PP, stages: a number or auto.")] = "auto",
    micro_batches: Annotated[Optional[int], typer.Option(help="Micro-batches per pipeline (default: the model's).")] = None,
    min_peers: Annotated[int, typer.Option(help="Publish the first plan once this many peers are ready.")] = 1,
    min_trusted: Annotated[int, typer.Option(help="Never put the whole model on fewer peers than this whose "
                                                  "claimed speed their training has not confirmed.")] = 2,
    plan: Annotated[str, typer.Option(help="scheduled (the live objective), or a baseline to compare: paper (the "
                                           "search on DT-FM's communication cost), random or default.")] = "scheduled",
    time_budget: Annotated[float, typer.Option("--time-budget", help="Search budget per plan, seconds.")] = 5.0,
    seed: Annotated[int, typer.Option(help="Seed of the search and of the random baseline.")] = 0,
    ttl: Annotated[float, typer.Option(help="Seconds the published assignment lives without a refresh.")] = 60.0,
    debounce: Annotated[float, typer.Option(help="Seconds membership must stay unchanged before a re-plan.")] = 5.0,
    measure_wait: Annotated[float, typer.Option(help="Seconds a re-plan may wait for new links to be measured.")] = 60.0,
    improvement: Annotated[float, typer.Option(help="Re-plan on the same peers only if this fraction faster.")] = 0.1,
    reconsider: Annotated[float, typer.Option(help="Seconds between checks for a clearly better plan.")] = 30.0,
    save_plan: Annotated[Optional[Path], typer.Option(help="Write the latest plan and its matrices here (JSON).")] = None,
    payback_steps: Annotated[int, typer.Option(help="A re-plan moves peers off their stages only if the time it "
                                                    "saves wins back their state download within this many "
                                                    "steps.")] = 200,
    checkpoint_every: Annotated[int, typer.Option(help="Steps between checkpoints of the peers that keep them "
                                                       "(hetswarm join --checkpoint-dir).")] = 50,
    checkpoint_every_s: Annotated[Optional[float], typer.Option(
        "--checkpoint-every-s", help="Also checkpoint at least this often (seconds, in predicted step time).")] = None,
    lost_state_wait: Annotated[float, typer.Option(help="Seconds to wait for a peer holding layers nobody else "
                                                        "holds before they restart from the seed.")] = 120.0,
    compression: Annotated[str, typer.Option(help="Codecs of activations, their gradients and the all-reduce: "
                                                  "model (the model's widths: fp16 activations, fp32 gradients), "
                                                  "none (fp32), fp16, 8bit, auto (per hop and stage group, the "
                                                  "least lossy codec that keeps the predicted step within 5 % of "
                                                  "the fastest), aq-sgd (8bit, and 4-bit "
                                                  "activation deltas from the second pass on; needs "
                                                  "--data-period), sparse (8bit, and each step's all-reduce "
                                                  "of a random 1/16 of the gradient), powersgd (8bit, and "
                                                  "each gradient matrix all-reduced as low-rank factors holding "
                                                  "1/4 of its values), or aq-powersgd (both: 4-bit activation deltas "
                                                  "and activation gradients, factors holding 1/4; needs "
                                                  "--data-period).")] = "model",
    data_period: Annotated[Optional[int], typer.Option(help="Steps after which the data order repeats (a pass); "
                                                            "aq-sgd and aq-powersgd need it.")] = None,
    lr_warmup_steps: Annotated[Optional[int], typer.Option(help="Steps over which the learning rate rises "
                                                                "linearly to its full value (default: the model "
                                                                "preset's, none for the built-in ones).")] = None,
    aggregation: Annotated[str, typer.Option(help="How stage groups combine gradients: mean, or centered-clip "
                                                  "(robust to a few hostile members; for open swarms).")] = "mean",
    rollback_spike: Annotated[float, typer.Option(help="Roll back to the last checkpoint when a step's loss is "
                                                       "this many times its recent median (0: never).")] = 2.0,
    eval_every: Annotated[int, typer.Option(help="Every pipeline measures its loss on the data's held-out split "
                                                 "every this many steps (0: never).")] = 0,
    export_every: Annotated[Optional[int], typer.Option(help="Write the live model as a Hugging Face folder "
                                                             "(--export-dir/step-K) every this many steps.")] = None,
    export_dir: Annotated[Optional[Path], typer.Option(help="Where --export-every writes.")] = None,
    closed: Annotated[bool, typer.Option("--closed", help="Plan only peers holding a join token of this coordinator "
                                                         "(hetswarm token) or on --allow-list.")] = False,
    allow_list: Annotated[Optional[Path], typer.Option(help="File of peer ids (one per line) admitted to a closed "
                                                             "swarm; implies --closed.")] = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = DEFAULT_METRICS_HOST,
    verbose: VerboseOpt = False,
    log_format: LogFormatOpt = "text",
) -> None:
    """Run the coordinator: watch the swarm, schedule it (DT-FM) and broadcast signed assignments.

    With --new-swarm (and no --initial-peers) it is the first node of a new swarm. It prints the line volunteers
    paste, with the `--coordinator PEER_ID` they pin, and re-plans when peers come and go or a clearly better plan
    appears. With --identity-path it keeps its versions, the training step and the plan in force in
    IDENTITY_PATH.state.json, so that a restart goes on where it stopped.
    """
    configure_logging(verbose, log_format)
    if (export_every is None) != (export_dir is None) or (export_every is not None and export_every < 1):
        raise RejectedInput("give --export-every (a positive number of steps) and --export-dir together")
    if not initial_peers and not new_swarm:  # a restarted coordinator alone would plan a swarm of its own
        raise HetswarmError("give --initial-peers of a peer in the swarm, or --new-swarm to start a new one with "
                            "this coordinator as its first peer")
    overrides = {name: value for name, value in (("micro_batches", micro_batches), ("data_period", data_period),
                                                 ("lr_warmup_steps", lr_warmup_steps)) if value}
    model_config = load_model(model, **overrides)
    if init_from is not None:
        model_config = starting_from(model_config, init_from)
    if data is not None:
        model_config = trained_on(model_config, data)
    planner_config = PlannerConfig(
        model=model_config, d_dp=_degree("--dp", dp), d_pp=_degree("--pp", pp), placement=plan,
        search=SearchConfig(time_budget_s=time_budget, seed=seed), min_peers=min_peers, min_trusted=min_trusted,
        debounce_s=debounce,
        measure_wait_s=measure_wait, improvement=improvement, reconsider_s=reconsider, payback_steps=payback_steps,
        compression=compression,
    )
    broadcast_config = BroadcastConfig(swarm=swarm, ttl_s=ttl, interval_s=min(1.0, ttl / 4), save_plan=save_plan,
                                       state_path=state_path_for(identity_path) if identity_path else None,
                                       checkpoint_every=checkpoint_every, checkpoint_every_s=checkpoint_every_s,
                                       lost_state_wait_s=lost_state_wait, rollback_spike=rollback_spike,
                                       aggregation=_aggregation(aggregation), eval_every=eval_every)
    node_config = NodeConfig(swarm=swarm, initial_peers=tuple(initial_peers), host_maddrs=tuple(host_maddrs),
                             announce_maddrs=tuple(announce_maddrs), identity_path=identity_path)
    allowed = load_allow_list(allow_list) if allow_list is not None else frozenset()
    export = None if export_every is None else ExportPlan(every=export_every, folder=export_dir, data=data)
    run_coordinator(node_config, planner_config, broadcast_config, closed=closed or allow_list is not None,
                    allowed=allowed, metrics=metrics_address(metrics_port, metrics_host), export=export)


def _degree(option: str, value: str) -> int | None:
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise RejectedInput(f"{option} must be a positive number or auto, got {value!r}") from None


def _aggregation(name: str) -> str:
    if name not in ("mean", "centered-clip"):
        raise RejectedInput(f"--aggregation must be mean or centered-clip, got {name!r}")
    return name.replace("-", "_")


def load_model(model: str, **overrides) -> ModelConfig:
    """--model: a preset, a JSON file of ModelConfig fields, or a Hugging Face folder or its config.json (told
    apart by its `model_type`); transformers is imported for the last only."""
    path = Path(model)
    if path.is_file() and path.suffix == ".json":
        try:
            is_hf = "model_type" in json.loads(path.read_text())
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(f"{path} is not a model config ({type(e).__name__}: {e})") from None
        path = path.parent if is_hf else path
    if not path.is_dir():
        return load_model_config(model, **overrides)
    from hetswarm.client.training.hf_folder import model_config_of
    return replace(model_config_of(path), **overrides)


def starting_from(model: ModelConfig, folder: Path) -> ModelConfig:
    """The model, starting from the folder's weights (ModelConfig.init_digest); the folder must build its shape."""
    from hetswarm.client.training.hf_folder import model_config_of, same_shape, weights_digest

    if not same_shape(model_config_of(folder), model):
        raise ConfigError(f"--init-from {folder} is not the shape of --model {model.name!r}: give the folder to "
                          "--model too")
    return replace(model, init_digest=weights_digest(folder))


def trained_on(model: ModelConfig, path: Path) -> ModelConfig:
    """The model, pinned to the data at `path` (ModelConfig.data_digest); its vocabulary must hold the data's."""
    from hetswarm.client.training.data import TokenSource

    data = TokenSource.from_path(path)
    if data.vocab_size > model.vocab_size:
        raise ConfigError(f"--data {path} has a vocabulary of {data.vocab_size}, more than the {model.vocab_size} "
                          f"tokens of --model {model.name!r}")
    return replace(model, data_digest=data.digest)
