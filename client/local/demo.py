"""`hetswarm demo`: a whole swarm on one machine that measures, schedules, trains, and checks its own prediction.

A bootstrap node and N clients start as separate processes on 127.0.0.1, their links emulated from the DT-FM
world-wide scenario (two clients per region or more, so a plan can keep each stage group inside a region). Once
the clients measured their links (every pair up to 17 clients, the first round of sparse measurement past that:
protocol/measurement_policy.py), a coordinator joins and publishes a plan; the clients train it while this process
watches their Progress records through its own read-only DHT node. A plan is then replaced by the next one asked for
(`random` by default) on the same clients and links: the coordinator restarts with the same identity, so the
clients' pinned key still holds and the versions keep growing. Each phase's measured step time is the median,
over the peers, of (time of the last step − time of the first step after warm-up) / steps between them, from the
Progress records' timestamps; its predicted step time is the assignment's.

Before its swarm stops, the first phase's model leaves it as `hetswarm export` takes it from a live swarm (the
members' newest common step, every part checked against the digest most holders report), is written as a Hugging
Face folder, and transformers continues SAMPLE_PROMPT with it (greedy: the same folder gives the same sample).

This process measures the machine's throughput before any client starts (`run_swarm`), so that the clients find
it cached rather than the first of them measuring it among the others' start-up, and every later `hetswarm join`
publishing that figure.

Every process is started through LocalSwarm and reaped by PID in `finally`, on Ctrl+C too.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.monitor.snapshot import SwarmSnapshot
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.hardware import probe_hardware, resolve_device
from hetswarm.client.peer.held_out import swarm_held_out
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.peer.node import NodeConfig, identity_for, start_dht_for_process
from hetswarm.coordinator.planner import PLACEMENTS
from hetswarm.protocol.errors import ConfigError, HetswarmError
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.measurement_policy import expected_links
from hetswarm.protocol.model_config import MODEL_PRESETS
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, PeerRecord, Progress
from hetswarm.protocol.remembered_peers import RememberedPeers
from hetswarm.protocol.wire_format import COMPRESSION_POLICIES

__all__ = ["DemoConfig", "DemoWatch", "EXPORT_FOLDER", "PhaseResult", "REGIONS", "SAMPLE_PROMPT", "run_swarm"]

logger = logging.getLogger(__name__)

DEMO_COMPRESSION = "8bit"
"""The policy that won benchmarks/compression.py on the demo's swarm (benchmarks/RESULTS.md)."""
REGIONS = ("Oregon", "Tokyo", "Frankfurt", "Seoul", "Virginia", "London", "Ohio", "Ireland")
"""World-wide scenario regions, in the order clients fill them."""
_POLL_S = 0.5
SAMPLE_PROMPT = "The swarm "
SAMPLE_TOKENS = 48
EXPORT_FOLDER = "model"
"""Where, in the first phase's run folder, its trained model is exported."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoConfig:
    """One demo or benchmark run: the swarm, and the plans it trains one after the other."""

    clients: int = 8
    regions: tuple[str, ...] = REGIONS
    """World-wide scenario regions the clients fill, in order."""
    clients_per_region: int | None = None
    """Clients in each region; None: as few as hold them all, at least 2."""
    dp: int = 2
    """Pipelines."""
    stages: int | None = None
    """Stages; None: clients // dp, every client placed. Fewer leave the other clients standing by."""
    model: str = "tiny"
    placements: tuple[str, ...] = ("scheduled", "random")
    """Plans trained in turn on the same clients; the first is the one the loss curve is reported for."""
    shape_chosen: tuple[str, ...] = ()
    """Placements whose shape the coordinator chooses (`--dp auto --pp auto`: the stages, the pipelines, and which
    clients stand by); the others run dp × clients // dp."""
    steps: tuple[int, ...] = (20, 10)
    """Measured steps per placement, after the warm-up."""
    warmup_steps: int = 2
    scenario: str = "worldwide"
    bandwidth_scale: float = 0.005
    """Emulated bandwidths × this, so that a tiny model's traffic outweighs its compute on a shared CPU."""
    seed: int = 0
    time_budget_s: float = 2.0
    workdir: Path | None = None
    start_timeout_s: float | None = None
    """For the clients to come up and measure their links, and for each plan to reach its first step; None: 180 s,
    and 20 s more for each client past 8 (on 2 cores, 32 clients took 4.5 min to come up and measure)."""
    step_timeout_s: float = 60.0
    """Most seconds any one step may take before the run is given up."""
    compression: str = DEMO_COMPRESSION
    """The coordinator's --compression policy (protocol/wire_format.py)."""
    data_period: int | None = None
    """The coordinator's --data-period: steps per pass over a repeating data order (aq-sgd needs one)."""
    lr_warmup_steps: int = 0
    """The coordinator's --lr-warmup-steps (ModelConfig.lr_warmup_steps)."""
    eval_every: int = 5
    """The coordinator's --eval-every: steps between the pipelines' held-out losses (0: none)."""
    ttl_s: float = 20.0
    """The clients' and the coordinator's --ttl: a record lives this long past its last refresh, so a peer that died
    leaves the view within it (the product's default is 60 s; the demo's is short for quick re-plans)."""
    emulate_tflops: tuple[float, ...] = ()
    """Client i computes as fast as a device of emulate_tflops[i % len] TFLOPS (`hetswarm join --emulate-tflops`);
    empty: as fast as this machine."""

    def __post_init__(self) -> None:
        if self.clients < 2 or self.dp < 1 or (self.stages is None and self.clients % self.dp):
            raise ConfigError(f"clients ({self.clients}) must be a multiple of dp ({self.dp}), at least 2")
        if self.stages is not None and not 1 <= self.stages * self.dp <= self.clients:
            raise ConfigError(f"{self.stages} stages × {self.dp} pipelines do not fit {self.clients} clients")
        if self.per_region < 1 or self.clients > self.per_region * len(self.regions):
            raise ConfigError(f"{self.clients} clients do not fit {len(self.regions)} regions with "
                             f"{self.per_region} per region")
        if self.model not in MODEL_PRESETS:
            raise ConfigError(f"unknown model {self.model!r}; presets: {', '.join(MODEL_PRESETS)}")
        if len(self.placements) != len(self.steps) or not self.placements:
            raise ConfigError(f"one step count per placement: {self.placements} vs {self.steps}")
        for placement in self.placements + self.shape_chosen:
            if placement not in PLACEMENTS:
                raise ConfigError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
        if any(tflops <= 0 for tflops in self.emulate_tflops):
            raise ConfigError(f"emulated TFLOPS must be positive, got {self.emulate_tflops}")
        if self.compression not in COMPRESSION_POLICIES:
            raise ConfigError(f"compression must be one of {', '.join(COMPRESSION_POLICIES)}, got {self.compression!r}")
        if min(self.steps) < 2 or self.warmup_steps < 0 or self.bandwidth_scale <= 0 or self.eval_every < 0:
            raise ConfigError(f"need >= 2 steps per plan, warmup >= 0, bandwidth_scale > 0, eval_every >= 0; got "
                             f"{self.steps}, {self.warmup_steps}, {self.bandwidth_scale}, {self.eval_every}")

    @property
    def start_wait_s(self) -> float:
        """`start_timeout_s`, or its default for this many clients."""
        return self.start_timeout_s if self.start_timeout_s is not None else 180.0 + 20.0 * max(0, self.clients - 8)

    @property
    def pp(self) -> int:
        return self.stages if self.stages is not None else self.clients // self.dp

    @property
    def per_region(self) -> int:
        return self.clients_per_region or max(2, -(-self.clients // len(self.regions)))

    def sites(self) -> list[tuple[str, str]]:
        """(client name, region) of every client."""
        per_region = self.per_region
        return [(f"{self.regions[i // per_region].lower()}-{i % per_region + 1}", self.regions[i // per_region])
                for i in range(self.clients)]

    def client_args(self, index: int, region: str, coordinator_id: str) -> list[str]:
        """`hetswarm join` options of client `index` (of `sites`), in `region`, pinned to `coordinator_id`."""
        speed = (["--emulate-tflops", str(self.emulate_tflops[index % len(self.emulate_tflops)])]
                 if self.emulate_tflops else [])
        return ["--emulate", self.scenario, "--site", region, "--bandwidth-scale", str(self.bandwidth_scale),
                "--coordinator", coordinator_id, "--seed", str(self.seed), "--torch-threads", "1",
                "--ttl", str(self.ttl_s), *speed]


@dataclass
class PhaseResult:
    """One plan's run: what was predicted, what was measured, and the losses seen."""

    placement: str
    version: int
    predicted_step_s: float
    breakdown: dict[str, float]
    first_step: int
    wire: str
    """The plan's codecs, in words (WireFormat.describe)."""
    measured_step_s: float | None = None
    compute_s: float | None = None
    wait_s: float | None = None
    losses: dict[int, float] = field(default_factory=dict)
    """Step → mean loss of the last-stage peers that reported it."""
    loss_times: dict[int, float] = field(default_factory=dict)
    """Step → seconds from the phase's first Progress record to the first report of the step's loss."""
    held_out: dict[int, float] = field(default_factory=dict)
    """Step → the held-out loss measured after it, where the pipelines agreed on it (client/peer/held_out.py)."""
    sample: str | None = None
    """What the phase's model added to SAMPLE_PROMPT (the first phase's only; module docstring)."""
    sample_step: int | None = None
    """The step of the model that was sampled."""
    exported: Path | None = None
    """The Hugging Face folder it was sampled from."""

    @property
    def error(self) -> float | None:
        """Measured relative to predicted: +0.1 means 10 % slower than predicted."""
        return None if self.measured_step_s is None else self.measured_step_s / self.predicted_step_s - 1


class DemoWatch:
    """What this process has seen of the swarm through its read-only DHT node."""

    def __init__(self, records: SwarmRecords, coordinator_id: str) -> None:
        self.records, self.coordinator_id = records, coordinator_id
        self.peers: dict[str, PeerRecord] = {}
        self.assignment: Assignment | None = None
        self.history: dict[tuple[str, int, int], Progress] = {}
        """(peer, assignment version, step) → its Progress record."""
        self.latest: dict[str, Progress] = {}
        self.measured: tuple[int, int] = (0, 0)
        """(pairs measured, pairs) among the present peers."""
        self.status = "starting"
        self.phases: list[PhaseResult] = []
        self.remembered = RememberedPeers()

    async def refresh(self) -> None:
        """One snapshot more; a read past its deadline leaves what was seen before."""
        try:
            snapshot = await SwarmSnapshot.read(self.records, remembered=self.remembered)
        except TimeoutError:
            logger.debug("Reading the demo swarm's records timed out; trying again")
            return
        self.peers, self.measured = snapshot.peers, snapshot.links_measured()
        self.assignment = snapshot.assignment(self.coordinator_id) or self.assignment
        for peer, record in snapshot.progress.items():
            if record.health == "training":  # a retrying peer's record names the step it is stuck at
                self.history.setdefault((peer, record.assignment_version, record.step), record)
            self.latest[peer] = record

    def steps_of(self, version: int) -> dict[str, list[Progress]]:
        by_peer: dict[str, list[Progress]] = {}
        for (peer, v, _), record in sorted(self.history.items()):
            if v == version:
                by_peer.setdefault(peer, []).append(record)
        return by_peer


def measured_step_s(by_peer: dict[str, list[Progress]], *, from_step: int) -> float | None:
    """Median over peers of the mean step period after `from_step`, from the records' publication times."""
    periods = []
    for records in by_peer.values():
        kept = sorted((r for r in records if r.step >= from_step), key=lambda r: r.step)
        if len(kept) >= 2 and kept[-1].step > kept[0].step:
            periods.append((kept[-1].updated_at - kept[0].updated_at) / (kept[-1].step - kept[0].step))
    return statistics.median(periods) if periods else None


async def _wait(watch: DemoWatch, done: Callable[[], bool], timeout_s: float, what: str,
                on_update: Callable[[DemoWatch], None]) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        await watch.refresh()
        on_update(watch)
        if done():
            return
        if time.monotonic() > deadline:
            raise HetswarmError(f"the demo swarm did not {what} within {timeout_s:.0f} s")
        await asyncio.sleep(_POLL_S)


async def _run_phase(swarm: LocalSwarm, watch: DemoWatch, config: DemoConfig, placement: str, steps: int,
                     coordinator_key: Path, on_update: Callable[[DemoWatch], None]) -> PhaseResult:
    n = config.clients
    watch.status = f"{placement} run: clients measure their links"
    await _wait(watch, lambda: len(watch.peers) == n and watch.measured[0] >= expected_links(n),
                config.start_wait_s, f"bring up {n} clients and measure their links", on_update)
    watch.status = f"{placement} run: the coordinator plans"
    swarm.start(
        "coordinator", "coordinator", "--initial-peers", swarm.initial_peers, "--host-maddrs", LOOPBACK,
        "--swarm", swarm.swarm, "--identity-path", str(coordinator_key), "--model", config.model,
        *_shape_options(config, placement), "--min-peers", str(n), "--plan", placement,
        "--time-budget", str(config.time_budget_s), "--seed", str(config.seed), "--ttl", str(config.ttl_s),
        "--debounce", "1",
        "--reconsider", "3600", "--save-plan", str(swarm.workdir / "plan.json"), "--compression", config.compression,
        "--eval-every", str(config.eval_every),
        *(("--data-period", str(config.data_period)) if config.data_period else ()),
        *(("--lr-warmup-steps", str(config.lr_warmup_steps)) if config.lr_warmup_steps else ()))
    await _wait(watch, lambda: watch.assignment is not None, config.start_wait_s, f"publish a {placement} plan",
                on_update)
    assignment = watch.assignment
    phase = PhaseResult(placement=placement, version=assignment.version, first_step=assignment.step,
                        predicted_step_s=assignment.predicted_step_s, breakdown=dict(assignment.breakdown),
                        wire=assignment.wire_format().describe())
    watch.phases.append(phase)
    watch.status = f"{placement} run: training"
    last = assignment.step + config.warmup_steps + steps
    reached = lambda: sum(1 for r in watch.steps_of(phase.version).values() if r[-1].step >= last) == \
        len(assignment.roles)  # standbys do not train
    await _wait(watch, reached, config.start_wait_s + config.step_timeout_s * (last - assignment.step),
                f"train {last - assignment.step} steps of the {placement} plan", on_update)
    _measure(phase, watch, assignment, config.warmup_steps)
    watch.status = f"{placement} run: done"
    return phase


def _shape_options(config: DemoConfig, placement: str) -> tuple[str, ...]:
    dp, pp = ("auto", "auto") if placement in config.shape_chosen else (config.dp, config.pp)
    return "--dp", str(dp), "--pp", str(pp)


def _measure(phase: PhaseResult, watch: DemoWatch, assignment: Assignment, warmup_steps: int) -> None:
    by_peer = watch.steps_of(phase.version)
    phase.measured_step_s = measured_step_s(by_peer, from_step=phase.first_step + warmup_steps)
    kept = [r for records in by_peer.values() for r in records if r.step >= phase.first_step + warmup_steps]
    phase.compute_s = statistics.median(r.compute_s for r in kept) if kept else None
    phase.wait_s = statistics.median(r.wait_s for r in kept) if kept else None
    last_stage = {p for p, role in assignment.roles.items() if role.stage == assignment.d_pp - 1}
    started = min((r.updated_at for records in by_peer.values() for r in records), default=0.0)
    for step in sorted({r.step for records in by_peer.values() for r in records}):
        reports = [r for p in last_stage for r in by_peer.get(p, []) if r.step == step and r.loss is not None]
        if reports:
            phase.losses[step] = sum(r.loss for r in reports) / len(reports)
            phase.loss_times[step] = min(r.updated_at for r in reports) - started
    phase.held_out = _held_out_losses(by_peer, assignment)


def _held_out_losses(by_peer: dict[str, list[Progress]], assignment: Assignment) -> dict[int, float]:
    """Step → the held-out loss measured after it, as the plan's last stages vouch for it (a plan of one pipeline
    has only its word)."""
    found = {}
    for step in sorted({r.held_out_step for records in by_peer.values() for r in records} - {None}):
        reports = {peer: next(r for r in records if r.held_out_step == step)
                   for peer, records in by_peer.items() if any(r.held_out_step == step for r in records)}
        held_out = swarm_held_out(assignment, reports)
        if held_out is not None and (held_out.corroborated or assignment.d_dp == 1):
            found[step] = held_out.loss
    return found


def run_swarm(config: DemoConfig, *, on_update: Callable[[DemoWatch], None] = lambda watch: None,
              on_workdir: Callable[[Path], None] = lambda path: None) -> list[PhaseResult]:
    """Trains every placement of `config` in turn, each on a fresh swarm of the same identities and sites (so
    no plan inherits another's state or a half-finished switch), and reaps every process it started.

    Raises:
        HetswarmError: a process did not come up, or training did not progress in time (the logs are named).
    """
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="hetswarm-demo-"))
    on_workdir(workdir)
    keys = workdir / "keys"
    coordinator_id = peer_id_of(load_identity(keys / "coordinator.key").get_public_key())  # clients pin it first
    probe_hardware(resolve_device(None))  # while the machine is quiet: 0.40 TFLOPS here, 0.019 amid 8 clients' start
    phases: list[PhaseResult] = []
    for placement, steps in zip(config.placements, config.steps):
        swarm = LocalSwarm("demo", workdir=workdir / f"run-{placement}")
        swarm.workdir.mkdir(parents=True, exist_ok=True)
        dht = None
        try:
            swarm.start_bootstrap()
            for index, (name, region) in enumerate(config.sites()):
                load_identity(keys / f"{name}.key")
                shutil.copy(keys / f"{name}.key", swarm.workdir / f"{name}.key")  # the same peer ids every run
                swarm.start_client(name, *config.client_args(index, region, coordinator_id))
            node_config = NodeConfig(swarm=swarm.swarm, initial_peers=(swarm.initial_peers,),
                                     host_maddrs=(LOOPBACK,), client_mode=True)
            dht = start_dht_for_process(node_config, identity_for(node_config))
            watch = DemoWatch(SwarmRecords(dht, swarm.swarm), coordinator_id)
            watch.phases = phases
            phase = asyncio.run(_run_phase(swarm, watch, config, placement, steps, keys / "coordinator.key",
                                           on_update))
            if len(phases) == 1:
                watch.status = f"{placement} run: exporting and sampling its model"
                on_update(watch)
                asyncio.run(_sample_model(dht, swarm.swarm, watch.assignment, swarm.workdir / EXPORT_FOLDER, phase))
        finally:
            _close(swarm, dht)
    return phases


async def _sample_model(dht, swarm: str, plan: Assignment, out: Path, phase: PhaseResult) -> None:
    """The plan's model, fetched from its members, exported to `out` and continued from SAMPLE_PROMPT (module
    docstring)."""
    from hetswarm.client.training.hf_folder import export_folder, sample  # torch and transformers: only here
    from hetswarm.client.training.state_handoff import download_model

    state = await download_model(dht, swarm, plan, timeout_s=60.0)
    await asyncio.to_thread(export_folder, plan.model_config(), state.tensors, out)
    phase.sample_step, phase.exported = state.step, out
    phase.sample = await asyncio.to_thread(sample, out, SAMPLE_PROMPT, max_new_tokens=SAMPLE_TOKENS, temperature=0)


def _close(swarm: LocalSwarm, dht) -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl+C must not cut the clean-up short
    try:
        for peer in swarm.peers:  # all leave at once; close() then waits for each and kills what is left
            peer.signal(signal.SIGINT)
        if dht is not None:
            dht.shutdown()
        swarm.close()
    finally:
        signal.signal(signal.SIGINT, previous)
