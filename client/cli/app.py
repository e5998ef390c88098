"""The `hetswarm` command: join a swarm, monitor it, plan schedules, run a coordinator or the demo."""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from hetswarm.client.cli import TEST_PLUGIN_ENV, processes
from hetswarm.client.cli.coordinator import coordinator
from hetswarm.client.cli.data import data_app
from hetswarm.client.cli.demo import demo
from hetswarm.client.cli.doctor import doctor
from hetswarm.client.cli.export import export
from hetswarm.client.cli.generate import generate
from hetswarm.client.cli.options import (
    AnnounceMaddrsOpt,
    CoordinatorOpt,
    EnvvarCommand,
    HostMaddrsOpt,
    IdentityPathOpt,
    InitialPeersOpt,
    JsonOpt,
    LogFormatOpt,
    MetricsHostOpt,
    MetricsPortOpt,
    SwarmOpt,
    VerboseOpt,
    configure_logging,
    metrics_address,
    new_app,
    run,
)
from hetswarm.client.cli.schedule import schedule
from hetswarm.client.peer.addresses import ANY_HOST, DEFAULT_METRICS_HOST, LOOPBACK
from hetswarm.client.peer.assignment_follower import check_coordinator_id
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.peer.link_probe import ProbeConfig
from hetswarm.client.peer.node import DEFAULT_SWARM, NodeConfig
from hetswarm.client.peer.volunteer import VolunteerConfig
from hetswarm.client.training.trainer import TrainerConfig, TrainingSetup
from hetswarm.protocol.errors import HetswarmError, RejectedInput
from hetswarm.protocol.join_tokens import issue_token
from hetswarm.protocol.keys import is_peer_id

app = new_app(no_args_is_help=True,
              help="Train foundation models on volunteered GPUs (DT-FM scheduling over a hivemind swarm).")
app.command()(schedule)
app.command(cls=EnvvarCommand)(coordinator)
app.command()(demo)
app.command()(doctor)
app.command()(export)
app.command()(generate)
app.add_typer(data_app, name="data")

@app.command(cls=EnvvarCommand)
def join(
    initial_peers: InitialPeersOpt = [],
    new_swarm: Annotated[bool, typer.Option("--new-swarm", help="Start a new swarm: this is its first peer.")] = False,
    host_maddrs: HostMaddrsOpt = [ANY_HOST],
    announce_maddrs: AnnounceMaddrsOpt = [],
    identity_path: IdentityPathOpt = None,
    swarm: SwarmOpt = DEFAULT_SWARM,
    device: Annotated[Optional[str], typer.Option(help="torch device to train on; default cuda if present.")] = None,
    public_name: Annotated[Optional[str], typer.Option(help="A name shown in the monitor.")] = None,
    throughput: Annotated[str, typer.Option(help="auto: use the cached GPU benchmark; eval: measure again.")] = "auto",
    emulate: Annotated[Optional[str], typer.Option(help="Emulate links from a scenario (name or JSON file).")] = None,
    site: Annotated[Optional[str], typer.Option(help="With --emulate: the scenario site this peer is at.")] = None,
    bandwidth_scale: Annotated[float, typer.Option(help="With --emulate: multiply every bandwidth by this.")] = 1.0,
    emulate_tflops: Annotated[Optional[float], typer.Option(help="Publish this dense 16-bit TFLOPS figure and compute "
                                                                 "as slowly as such a device would (below this "
                                                                 "device's own), to run mixed GPUs on one machine."
                                                            )] = None,
    ttl: Annotated[float, typer.Option(help="Seconds the peer record lives without a heartbeat.")] = 60.0,
    probe_bytes: Annotated[int, typer.Option(help="Most bytes streamed to a peer to measure bandwidth.")] = 8 * 2**20,
    max_links: Annotated[int, typer.Option(help="Most links this peer measures and publishes: the plan's, its "
                                                "site's, then a rotating sample (all of them up to this many "
                                                "other peers).")] = VolunteerConfig().max_links,
    coordinator: CoordinatorOpt = None,
    data: Annotated[Optional[Path], typer.Option(help="With --coordinator: text file or folder to train on, or "
                                                      "a folder of `hetswarm data prepare` (default: a built-in "
                                                      "corpus).")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="With --coordinator: stop training before this step "
                                                          "and keep serving until Ctrl+C.")] = None,
    seed: Annotated[int, typer.Option(help="With --coordinator: model and data seed, the same on every peer.")] = 0,
    torch_threads: Annotated[Optional[int], typer.Option(help="Cap torch's CPU threads (several clients on "
                                                              "one machine).")] = None,
    checkpoint_dir: Annotated[Optional[Path], typer.Option(help="With --coordinator: keep checkpoints of this "
                                                                "peer's stage here, when the plan asks it to, and "
                                                                "offer them to resume the run.")] = None,
    model_dir: Annotated[Optional[Path], typer.Option(help="With --coordinator: your copy of the Hugging Face "
                                                           "folder the coordinator's --init-from names (checked "
                                                           "by its SHA-256).")] = None,
    join_token: Annotated[Optional[str], typer.Option(help="The token the operator of a closed swarm gave you for "
                                                           "this identity (needs --identity-path).")] = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = DEFAULT_METRICS_HOST,
    verbose: VerboseOpt = False,
    log_format: LogFormatOpt = "text",
) -> None:
    """Join a swarm as a volunteer: measure this GPU and the links to peers, publish them, and serve until Ctrl+C.

    Every option can also be set by the environment variable shown beside it."""
    configure_logging(verbose, log_format)
    if not initial_peers and not new_swarm:
        raise HetswarmError("give --initial-peers of a peer in the swarm, or --new-swarm to start one")
    if site is not None and emulate is None:
        raise HetswarmError("--site only makes sense with --emulate SCENARIO")
    if join_token is not None and identity_path is None:
        raise HetswarmError("--join-token is issued for one identity: give the --identity-path it was issued for")
    node_config = NodeConfig(swarm=swarm, initial_peers=tuple(initial_peers), host_maddrs=tuple(host_maddrs),
                             announce_maddrs=tuple(announce_maddrs), identity_path=identity_path)
    volunteer_config = VolunteerConfig(ttl_s=ttl, view_interval_s=min(5.0, ttl / 4), public_name=public_name,
                                       site=site, probe=ProbeConfig(max_payload_bytes=probe_bytes), max_links=max_links,
                                       coordinator=check_coordinator_id(coordinator) if coordinator else None,
                                       join_token=join_token.strip() if join_token else None)
    emulation = processes.Emulation(scenario=emulate, site=site, bandwidth_scale=bandwidth_scale) if emulate else None
    if emulation is not None and site is None:
        raise HetswarmError("--emulate needs --site: the scenario site this peer pretends to be at")
    training = TrainingSetup(data_path=data, seed=seed, torch_threads=torch_threads,
                             config=TrainerConfig(max_steps=max_steps, ttl_s=ttl, checkpoint_dir=checkpoint_dir,
                                                  model_dir=model_dir)
                             ) if coordinator else None
    processes.join(node_config, volunteer_config, device=device, throughput=throughput, emulation=emulation,
                   training=training, metrics=metrics_address(metrics_port, metrics_host),
                   emulated_tflops=emulate_tflops)


@app.command()
def token(
    peer_id: Annotated[str, typer.Argument(help="The volunteer's peer id (printed by `hetswarm join`).")],
    identity_path: Annotated[Path, typer.Option(help="The coordinator's identity file: tokens are signed with it.")],
    swarm: SwarmOpt = DEFAULT_SWARM,
) -> None:
    """Issue a join token that admits one volunteer to a closed swarm (`hetswarm coordinator --closed`)."""
    if not identity_path.exists():
        raise HetswarmError(f"{identity_path} does not exist: give the coordinator's --identity-path")
    if not is_peer_id(peer_id):
        raise HetswarmError(f"{peer_id!r} is not a peer id; copy the `Joined swarm ... as Qm...` id the volunteer's "
                            "client printed")
    print(issue_token(load_identity(identity_path), swarm, peer_id))


@app.command()
def bootstrap(
    host_maddrs: HostMaddrsOpt = [ANY_HOST],
    announce_maddrs: AnnounceMaddrsOpt = [],
    identity_path: IdentityPathOpt = None,
    swarm: SwarmOpt = DEFAULT_SWARM,
    verbose: VerboseOpt = False,
) -> None:
    """Start the first node of a swarm (DHT only) and print the line volunteers paste."""
    configure_logging(verbose)
    processes.bootstrap(NodeConfig(swarm=swarm, host_maddrs=tuple(host_maddrs),
                                   announce_maddrs=tuple(announce_maddrs), identity_path=identity_path))


@app.command()
def monitor(
    initial_peers: InitialPeersOpt,
    swarm: SwarmOpt = DEFAULT_SWARM,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    json_output: JsonOpt = False,
    refresh: Annotated[float, typer.Option(help="Seconds between refreshes of the live view.")] = 2.0,
    coordinator: CoordinatorOpt = None,
    web: Annotated[Optional[str], typer.Option("--web", metavar="HOST:PORT", help="Serve the live view as a web "
                                               "page (and JSON at /api/v1/state) here; port 0 picks a free one."
                                               )] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Watch peers, their GPUs, the link matrix and the current assignment; --json prints one snapshot for scripts.

    The assignment shown is the pinned --coordinator's, or else the newest version anyone published. With --web
    the live view is a page in the browser, with loss and step-time curves; the command prints its URL.
    """
    configure_logging(verbose)
    if not initial_peers:
        raise HetswarmError("give --initial-peers of a peer in the swarm")
    if web is not None and (once or json_output):
        raise RejectedInput("--web serves a live page until Ctrl+C; leave out --once and --json")
    node_config = NodeConfig(swarm=swarm, initial_peers=tuple(initial_peers), host_maddrs=(LOOPBACK,),
                             client_mode=True)
    processes.monitor(node_config, once=once or json_output, as_json=json_output, refresh_s=refresh,
                      coordinator=check_coordinator_id(coordinator) if coordinator else None, web=web)


def main() -> None:
    """Every command of the full app; expected errors become one red line on stderr and exit code 1."""
    if plugin := os.environ.get(TEST_PLUGIN_ENV):
        module, _, function = plugin.partition(":")
        getattr(importlib.import_module(module), function)()
    run(app)
