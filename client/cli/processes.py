"""The processes behind the commands that join a swarm (`join`, `bootstrap`, `monitor`, `coordinator`, `export`
from a live swarm): signals that leave cleanly, a DHT start that Ctrl+C does not reach, and each process's start-up
order."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live

from hetswarm.client.monitor.render import render
from hetswarm.client.monitor.snapshot import SwarmSnapshot
from hetswarm.client.peer.addresses import MetricsAddress
from hetswarm.client.peer.assignment_follower import reason_to_refuse
from hetswarm.client.peer.emulation import SiteLinks
from hetswarm.client.peer.hardware import emulate_tflops, probe_hardware, resolve_device
from hetswarm.client.peer.link_probe import unanswered
from hetswarm.client.peer.metrics import ClientCollector, CoordinatorCollector, beside, serve_metrics
from hetswarm.client.peer.node import NodeConfig, SwarmNode, identity_for, initial_peers_line, start_dht_for_process
from hetswarm.client.peer.reachability import ReachabilityServicer, has_public_address, report_reachability
from hetswarm.client.peer.volunteer import Volunteer, VolunteerConfig
from hetswarm.client.training.stage_state import StageState
from hetswarm.client.training.state_handoff import download_model
from hetswarm.client.training.trainer import TrainingSetup
from hetswarm.coordinator.admission import Admission
from hetswarm.coordinator.broadcaster import BroadcastConfig, Broadcaster
from hetswarm.coordinator.planner import PlannerConfig
from hetswarm.coordinator.replanner import Replanner
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.keys import probe_namespace, reachability_namespace
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.remembered_peers import RememberedPeers

if TYPE_CHECKING:
    from hetswarm.client.training.periodic_export import PeriodicExport

logger = logging.getLogger(__name__)

PING_TIMEOUT_S = 5.0
"""How long a peer the coordinator is about to place has to answer its ping."""
PING_AGAIN_TIMEOUT_S = 20.0
"""A peer that did not answer is pinged once more, with this long to answer, before it is planned out: with 64 peers
on 2 cores (benchmarks/swarm_scale.py), 14 of a first plan's 16 peers answered no 5-s ping, all of them up."""


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Runs `main(stop)` in a fresh event loop; SIGINT or SIGTERM set `stop` so main can leave cleanly."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())


@dataclass(frozen=True, kw_only=True, slots=True)
class Emulation:
    """--emulate SCENARIO --site NAME [--bandwidth-scale X]."""

    scenario: str
    site: str
    bandwidth_scale: float = 1.0

    def site_links(self) -> SiteLinks:
        links = SiteLinks.from_scenario(self.scenario, bandwidth_scale=self.bandwidth_scale)
        links.check_site(self.site)
        return links


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportPlan:
    """--export-every N --export-dir DIR of the coordinator (client/training/periodic_export.py)."""

    every: int
    folder: Path
    data: Path | None = None
    """The coordinator's --data: a prepared folder's tokenizer goes into every export."""

    def exporter(self, dht, swarm: str, broadcaster: Broadcaster) -> PeriodicExport:
        from hetswarm.client.training.periodic_export import PeriodicExport  # transformers: only when exporting
        from hetswarm.client.training.prepared_data import PreparedData

        prepared = PreparedData.open(self.data) if self.data and (self.data / "index.json").is_file() else None
        return PeriodicExport(dht=dht, swarm=swarm, every=self.every, folder=self.folder, data=prepared,
                              current=lambda: (broadcaster.published, broadcaster.state.step))


def _pinger(dht, swarm: str) -> Callable[[Collection[str]], Awaitable[set[str]]]:
    """The coordinator's `silent` (coordinator/broadcaster.py): pings from its own daemon, opened on first use."""
    p2p = None

    async def silent(peers: Collection[str]) -> set[str]:
        nonlocal p2p
        p2p = p2p or await dht.replicate_p2p()
        return await unanswered(p2p, peers, namespace=probe_namespace(swarm), timeout_s=PING_TIMEOUT_S,
                                again_s=PING_AGAIN_TIMEOUT_S)

    return silent


def announce(line: str) -> None:
    """The ready-to-paste line for other peers, on stdout even when logging is quiet (as hivemind-dht does)."""
    print(line, flush=True)


def join(node_config: NodeConfig, volunteer_config: VolunteerConfig, *, device: str | None, throughput: str,
         emulation: Emulation | None, training: TrainingSetup | None = None, metrics: MetricsAddress | None = None,
         emulated_tflops: float | None = None) -> None:
    """Serves as a volunteer until Ctrl+C; with `training`, trains the stage of every accepted assignment; with
    `metrics`, serves Prometheus metrics there; with `emulated_tflops`, publishes that figure and computes as
    slowly as such a device."""
    site_links = emulation.site_links() if emulation else None  # fail on a bad scenario before starting anything
    torch_device = resolve_device(device)
    identity = identity_for(node_config)
    dht = start_dht_for_process(node_config, identity)  # before torch's threads: the DHT forks
    metrics_server = None
    try:
        metrics_server = serve_metrics(metrics) if metrics else None  # a thread: only once the DHT has forked
        hardware = probe_hardware(torch_device, throughput=throughput)
        if emulated_tflops is not None:
            hardware = emulate_tflops(hardware, emulated_tflops)
            if training is not None:
                training = replace(training, config=replace(training.config, emulated_tflops=emulated_tflops))

        async def serve(stop: asyncio.Event) -> None:
            node = await SwarmNode.attach(node_config, dht, identity, site_links=site_links,
                                          site=emulation.site if emulation else None)
            announce(f"Joined swarm {node_config.swarm!r} as {node.peer_id}. Others can join with: "
                     f"{node.initial_peers_line}")
            namespace = reachability_namespace(node_config.swarm)
            own = [str(maddr) for maddr in await node.p2p.get_visible_maddrs()]
            checker = ReachabilityServicer(public_only=has_public_address(own))
            await checker.add_p2p_handlers(node.p2p, namespace=namespace)
            reachability = asyncio.create_task(  # advice only: in the background, never stops the client
                report_reachability(node.p2p, node.records, me=node.peer_id, namespace=namespace))
            trainer = training.build(node, torch_device) if training else None
            try:
                if trainer is not None:
                    await trainer.serve()  # before our record is out: peers resuming may ask for our checkpoints
                keeps_checkpoints = trainer is not None and trainer.checkpoints is not None
                volunteer = Volunteer(node, hardware, volunteer_config,
                                      on_assignment=trainer.follow if trainer else None,
                                      checkpoints=trainer.checkpoint_infos if keeps_checkpoints else None)
                if trainer is not None:  # the frames it sends update the links it measures, between probes
                    trainer.on_frame_sent = volunteer.prober.observe
                if keeps_checkpoints:  # the coordinator resumes and rolls back from what our record lists
                    trainer.checkpoints.on_saved = lambda: volunteer.publish_soon("checkpoint")
                if metrics_server is not None:
                    metrics_server.register(ClientCollector(volunteer, trainer))
                await volunteer.run(stop)
            finally:
                reachability.cancel()  # a no-op once it has reported; asyncio.run awaits it on the way out
                if trainer is not None:
                    await trainer.close()
                await node.p2p.shutdown()

        run_until_signal(serve)
    finally:
        if metrics_server is not None:
            metrics_server.close()
        dht.shutdown()


def bootstrap(node_config: NodeConfig) -> None:
    """A DHT-only node for others to join through; it publishes nothing."""
    dht = start_dht_for_process(node_config, identity_for(node_config))
    try:
        announce(f"Bootstrap node of swarm {node_config.swarm!r} is up. Volunteers join with:\n"
                 f"  hetswarm join {initial_peers_line(dht)}")
        run_until_signal(lambda stop: stop.wait())
    finally:
        dht.shutdown()


def monitor(node_config: NodeConfig, *, once: bool, as_json: bool, refresh_s: float, settle_s: float = 3.0,
            coordinator: str | None = None, web: str | None = None) -> None:
    """A client-mode, read-only peer that prints the swarm once or keeps a live view until Ctrl+C; with `web`
    (HOST:PORT) the live view is a page served there (client/monitor/web.py) instead of the table."""
    if web is not None:
        # Imported here: aiohttp would add ~0.25 s to the start of every other command.
        from hetswarm.client.monitor.web import WebAddress, serve_web
        address = WebAddress.parse(web)  # a bad value fails before the DHT starts
    dht = start_dht_for_process(node_config, identity_for(node_config))
    records = SwarmRecords(dht, node_config.swarm)
    try:
        if web is not None:
            run_until_signal(lambda stop: serve_web(records, address, stop=stop, coordinator=coordinator,
                                                    refresh_s=refresh_s, on_ready=announce))
            return

        remembered = RememberedPeers()  # across the reads of --watch

        async def read_snapshot() -> dict:
            try:
                return (await SwarmSnapshot.read(records, coordinator, remembered=remembered)).to_json(coordinator)
            except TimeoutError:
                raise HetswarmError(f"the swarm's records could not be read within {records.timeout_s:.0f} s; "
                                    "check --initial-peers and that those peers are up") from None

        async def first_snapshot() -> dict:
            deadline = asyncio.get_running_loop().time() + settle_s
            snapshot = await read_snapshot()
            while not snapshot["peers"] and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.5)  # a fresh node may not have found its neighbours yet
                snapshot = await read_snapshot()
            return snapshot

        if once:
            snapshot = asyncio.run(first_snapshot())
            if as_json:
                json.dump(snapshot, sys.stdout, indent=1)
                print()
            else:
                Console().print(render(snapshot))
            return

        async def watch(stop: asyncio.Event) -> None:
            with Live(render(await first_snapshot()), refresh_per_second=4) as live:
                while not stop.is_set():
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=refresh_s)
                    except TimeoutError:
                        live.update(render(await read_snapshot()))

        run_until_signal(watch)
    finally:
        dht.shutdown()


def fetch_live_model(node_config: NodeConfig, coordinator: str, *, timeout_s: float, settle_s: float = 10.0
                     ) -> tuple[ModelConfig, StageState]:
    """A client-mode peer that reads the pinned coordinator's plan and downloads the whole model from its members
    (client/training/state_handoff.py, download_model), for `hetswarm export` from a live swarm."""
    dht = start_dht_for_process(node_config, identity_for(node_config))

    async def fetch() -> tuple[ModelConfig, StageState]:
        records, deadline = SwarmRecords(dht, node_config.swarm), asyncio.get_running_loop().time() + settle_s
        while (plan := (await records.assignments(coordinator)).get(coordinator)) is None:
            if asyncio.get_running_loop().time() > deadline:  # a fresh node may not find the record at once
                raise HetswarmError(f"no plan of coordinator {coordinator} in swarm {node_config.swarm!r}; check "
                                    "--initial-peers, --swarm and --coordinator")
            await asyncio.sleep(0.5)
        if (reason := reason_to_refuse(plan)) is not None:
            raise HetswarmError(f"the coordinator's plan v{plan.version} cannot be followed: {reason}")
        return plan.model_config(), await download_model(dht, node_config.swarm, plan, timeout_s=timeout_s)

    try:
        return asyncio.run(fetch())
    finally:
        dht.shutdown()


def run_coordinator(node_config: NodeConfig, planner_config: PlannerConfig, broadcast_config: BroadcastConfig, *,
                    closed: bool = False, allowed: frozenset[str] = frozenset(),
                    metrics: MetricsAddress | None = None, export: ExportPlan | None = None) -> None:
    """Starts the DHT node, prints what volunteers paste (and pin), and broadcasts until Ctrl+C; with `metrics`,
    serves Prometheus metrics there; with `export`, writes the live model every so many steps. A `closed` swarm
    admits the `allowed` peers and those with our join tokens."""
    identity = identity_for(node_config)
    admission = Admission(swarm=node_config.swarm, closed=closed, allow=allowed,
                          coordinator_key=identity.private_key.get_public_key())
    dht = start_dht_for_process(node_config, identity)
    metrics_server = None
    try:
        metrics_server = serve_metrics(metrics) if metrics else None  # a thread: only once the DHT has forked
        announce(f"Coordinator of swarm {node_config.swarm!r} is up. Volunteers join with:\n"
                 f"  hetswarm join {initial_peers_line(dht)} --swarm {node_config.swarm} "
                 f"--coordinator {identity.peer_id}\nCoordinator peer id: {identity.peer_id}")
        broadcaster = Broadcaster(dht, private_key=identity.private_key, coordinator_id=identity.peer_id,
                                  replanner=Replanner(planner_config), config=broadcast_config, admission=admission,
                                  silent=_pinger(dht, node_config.swarm))
        beside_loops = []
        if metrics_server is not None:
            collector = CoordinatorCollector(lambda: broadcaster.published, SwarmRecords(dht, node_config.swarm))
            metrics_server.register(collector)
            beside_loops.append(collector.watch)
        if export is not None:
            beside_loops.append(export.exporter(dht, node_config.swarm, broadcaster).watch)
        run_until_signal(beside(broadcaster.run, *beside_loops))
        logger.info("Coordinator stopped")
    finally:
        if metrics_server is not None:
            metrics_server.close()
        dht.shutdown()
