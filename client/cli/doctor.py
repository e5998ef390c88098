"""`hetswarm doctor`: what joining a swarm needs, checked one at a time, each with a verdict and a hint.

The checks run in the order a join needs them, and a check that needs an earlier one that failed is shown as
`skip`: the p2p daemon starts on --host-maddrs; each --initial-peers peer answers a fresh dial; a DHT node finds the
swarm's records; a peer in view can dial this one back (client/peer/reachability.py); this clock is within the
3 s that hivemind tolerates; the GPU benchmark is cached for this device; and the versions. Every network step has
a deadline, so a dead swarm gives a FAIL in seconds rather than a hang.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import json
import platform
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import torch
import typer
from hivemind.p2p import P2P, PeerID
from hivemind.utils import MAX_DHT_TIME_DISCREPANCY_SECONDS, get_dht_time
from hivemind.utils.multiaddr import Multiaddr
from rich.text import Text

from hetswarm.client.cli.options import (
    AnnounceMaddrsOpt,
    HostMaddrsOpt,
    InitialPeersOpt,
    SwarmOpt,
    VerboseOpt,
    configure_logging,
    console,
)
from hetswarm.client.peer.addresses import ANY_HOST
from hetswarm.client.peer.hardware import cache_key, default_cache_path, resolve_device
from hetswarm.client.peer.hivemind_compat import ControlFailure, dial
from hetswarm.client.peer.node import DEFAULT_SWARM, NodeConfig, identity_for, start_dht_for_process
from hetswarm.client.peer.reachability import (
    ask_clock,
    check_reachability,
    dial_error_text,
    unreachable_advice,
)
from hetswarm.protocol.errors import HetswarmError, RejectedInput
from hetswarm.protocol.keys import reachability_namespace, short_id
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import PeerRecord

Verdict = Literal["ok", "warn", "FAIL", "skip"]
_STYLES: dict[str, str] = {"ok": "green", "warn": "yellow", "FAIL": "bold red", "skip": "dim"}
TESTED_HIVEMIND = "1.1.12"
RECORDS_SETTLE_S = 5.0
"""A fresh DHT node may need a moment to find the records; it reads again for up to this long."""


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report."""

    name: str
    verdict: Verdict
    detail: str
    hint: str = ""


Report = Callable[[Check], None]


def doctor(
    initial_peers: InitialPeersOpt = [],
    swarm: SwarmOpt = DEFAULT_SWARM,
    host_maddrs: HostMaddrsOpt = [ANY_HOST],
    announce_maddrs: AnnounceMaddrsOpt = [],
    device: Annotated[Optional[str], typer.Option(help="torch device join would train on; default cuda if "
                                                       "present.")] = None,
    timeout: Annotated[float, typer.Option(help="Deadline of each network check, seconds.")] = 10.0,
    verbose: VerboseOpt = False,
) -> None:
    """Check what joining a swarm needs: p2p daemon, bootstrap peers, the swarm's records, reachability, clock,
    GPU benchmark cache, versions. One line each: ok, warn, FAIL (with a hint) or skip; exit code 1 on a FAIL.

    Give it join's --host-maddrs and --announce-maddrs (with that join stopped): peers then dial the same address.
    """
    configure_logging(verbose)
    if not initial_peers:
        raise HetswarmError("give --initial-peers of a peer in the swarm")
    if timeout <= 0:
        raise RejectedInput(f"--timeout must be positive, got {timeout}")
    node_config = NodeConfig(swarm=swarm, initial_peers=tuple(initial_peers), host_maddrs=tuple(host_maddrs),
                             announce_maddrs=tuple(announce_maddrs))
    checks = run_checks(node_config, resolve_device(device), timeout_s=timeout, report=print_check)
    if any(check.verdict == "FAIL" for check in checks):
        raise typer.Exit(1)


def print_check(check: Check) -> None:
    """`VERDICT  name  detail  hint: ...` on one line (a Text, so that `[...]` in errors is not read as markup)."""
    line = Text.assemble((f"{check.verdict:<4}", _STYLES[check.verdict]), "  ", f"{check.name:<15} ", check.detail)
    if check.hint:
        line.append(f"  hint: {check.hint}", style="dim")
    console.print(line, soft_wrap=True, highlight=False)


def run_checks(config: NodeConfig, device: torch.device, *, timeout_s: float, report: Report) -> list[Check]:
    """Every check in order, each reported as soon as it is done; the DHT is started between two event loops,
    since it forks (docs/hivemind.md, pitfall 3)."""
    checks: list[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        report(check)

    peers: dict[str, PeerRecord] = {}
    if asyncio.run(_daemon_and_bootstrap(config, timeout_s=timeout_s, add=add)):
        peers = _swarm_checks(config, timeout_s=timeout_s, add=add)
    else:
        for name in ("swarm records", "reachability", "clock"):
            add(Check(name, "skip", "needs a bootstrap peer that answers"))
    add(gpu_cache_check(device))
    add(versions_check(peers))
    return checks


async def _daemon_and_bootstrap(config: NodeConfig, *, timeout_s: float, add: Report) -> bool:
    """Starts a client-only p2pd on --host-maddrs and dials each initial peer from it; True if any answered."""
    start = time.perf_counter()
    try:
        probe = await P2P.create(host_maddrs=list(config.host_maddrs), dht_mode="client", auto_nat=False,
                                 nat_port_map=False, use_relay=False, startup_timeout=timeout_s)
    except Exception as e:  # P2PDaemonError, OSError: a bad install, a port in use
        add(Check("p2p daemon", "FAIL", f"did not start on {' '.join(config.host_maddrs)}: {_one_line(e)}",
                  hint="is that port in use (a running join)? If p2pd is missing, reinstall hivemind"))
        add(Check("bootstrap peers", "skip", "needs the p2p daemon"))
        return False
    add(Check("p2p daemon", "ok", f"started in {time.perf_counter() - start:.1f} s on {' '.join(config.host_maddrs)}"))
    try:
        answers = await asyncio.gather(*[_dial(probe, maddr, timeout_s) for maddr in config.initial_peers])
    finally:
        await probe.shutdown()
    failed = [f"{maddr}: {detail}" for maddr, (answered, detail) in zip(config.initial_peers, answers) if not answered]
    n_answered = len(answers) - len(failed)
    if not failed:
        add(Check("bootstrap peers", "ok", f"{n_answered}/{len(answers)} answered "
                                           f"({', '.join(detail for _, detail in answers)})"))
    else:
        add(Check("bootstrap peers", "warn" if n_answered else "FAIL",
                  f"{n_answered}/{len(answers)} answered; " + "; ".join(failed),
                  hint="check each address and peer id, that those peers are up, and that outgoing TCP is allowed"))
    return n_answered > 0


async def _dial(probe: P2P, text: str, timeout_s: float) -> tuple[bool, str]:
    """A fresh connection to one initial peer, under a deadline; (answered, round trip or why not)."""
    try:
        maddr = Multiaddr(text)
        peer = PeerID.from_base58(maddr.value_for_protocol("p2p"))
        start = time.perf_counter()
        async with asyncio.timeout(timeout_s):
            await dial(probe, peer, [maddr.decapsulate(Multiaddr(f"/p2p/{peer.to_base58()}"))])
        return True, f"{(time.perf_counter() - start) * 1000:.0f} ms"
    except ControlFailure as e:
        return False, dial_error_text(e)
    except TimeoutError:
        return False, f"no answer within {timeout_s:.0f} s"
    except Exception as e:  # a multiaddr that parses but cannot be dialled
        return False, _one_line(e)


def _swarm_checks(config: NodeConfig, *, timeout_s: float, add: Report) -> dict[str, PeerRecord]:
    """Records, reachability and clock, from a DHT node started as join would start it (a throw-away identity)."""
    try:
        dht = start_dht_for_process(config, identity_for(config))
    except HetswarmError as e:
        add(Check("swarm records", "FAIL", str(e), hint="the bootstrap peers answered a dial but no DHT node "
                                                         "started: are they hetswarm/hivemind peers?"))
        add(Check("reachability", "skip", "needs a DHT node"))
        add(Check("clock", "skip", "needs a DHT node"))
        return {}
    try:
        return asyncio.run(_read_swarm(dht, config, timeout_s=timeout_s, add=add))
    finally:
        dht.shutdown()


async def _read_swarm(dht, config: NodeConfig, *, timeout_s: float, add: Report) -> dict[str, PeerRecord]:
    p2p = await dht.replicate_p2p()
    namespace = reachability_namespace(config.swarm)
    records = SwarmRecords(dht, config.swarm, timeout_s=timeout_s)
    try:
        try:
            peers = await records.peers()
            settle_until = time.monotonic() + RECORDS_SETTLE_S
            while not peers and time.monotonic() < settle_until:
                await asyncio.sleep(0.5)
                peers = await records.peers()
        except TimeoutError:
            add(Check("swarm records", "FAIL", f"the DHT did not answer within {timeout_s:.0f} s",
                      hint="the bootstrap peers may be overloaded; try again or other --initial-peers"))
            add(Check("reachability", "skip", "needs the swarm's records"))
            add(Check("clock", "skip", "needs the swarm's records"))
            return {}
        states = Counter(record.state for record in peers.values())
        if peers:
            add(Check("swarm records", "ok", f"{len(peers)} peer{'s' if len(peers) > 1 else ''} in swarm {config.swarm!r} ("
                      + ", ".join(f"{n} {state}" for state, n in states.most_common()) + ")"))
        else:
            add(Check("swarm records", "warn", f"no peer has published in swarm {config.swarm!r}",
                      hint="is --swarm right? A swarm whose first volunteer has not joined yet is empty too"))
        me = p2p.peer_id.to_base58()
        reach = await check_reachability(p2p, records, me=me, namespace=namespace, wait_for_peers_s=0.0)
        if reach.verdict == "reachable":
            add(Check("reachability", "ok", f"a peer dialled this one back ({reach.detail})"))
        elif reach.verdict == "unreachable":
            add(Check("reachability", "FAIL", reach.detail, hint=unreachable_advice(reach.maddrs)))
        else:
            add(Check("reachability", "warn", f"cannot check: {reach.detail}",
                      hint="needs a peer in view that runs `hetswarm join` of this version"))
        add(await _clock_check(p2p, peers, namespace=namespace, timeout_s=timeout_s))
        return peers
    finally:
        await p2p.shutdown()


async def _clock_check(p2p: P2P, peers: dict[str, PeerRecord], *, namespace: str, timeout_s: float) -> Check:
    """Our clock against peers' (a round trip each); without answers, against their records' timestamps, which
    can only show our clock behind theirs (a record is never stamped after it was published)."""
    limit_s = MAX_DHT_TIME_DISCREPANCY_SECONDS
    hint = "sync this clock (NTP: `timedatectl set-ntp true`, or chrony)"
    asked = random.sample(list(peers), min(3, len(peers)))
    readings = [r for r in await asyncio.gather(*[ask_clock(p2p, PeerID.from_base58(peer), namespace=namespace,
                                                            timeout_s=timeout_s) for peer in asked]) if r]
    if readings:
        worst = max(readings, key=lambda r: abs(r.offset_s))
        detail = (f"{worst.offset_s:+.2f} s (±{worst.rtt_s / 2:.2f} s) from {short_id(worst.peer)}, the furthest of "
                  f"{len(readings)}; hivemind refuses peers over {limit_s} s apart")
        if abs(worst.offset_s) > limit_s:
            return Check("clock", "FAIL", detail, hint=hint)
        return Check("clock", "warn" if abs(worst.offset_s) > limit_s / 2 else "ok", detail,
                     hint=hint if abs(worst.offset_s) > limit_s / 2 else "")
    if not peers:
        return Check("clock", "skip", "no peer in view to compare with")
    ahead_s = max(record.updated_at for record in peers.values()) - get_dht_time()
    if ahead_s > limit_s:
        return Check("clock", "FAIL", f"a peer's record is stamped {ahead_s:.1f} s ahead of this clock", hint=hint)
    return Check("clock", "warn", "no peer answered a clock query; no record is stamped ahead of this clock",
                 hint="only a clock behind the swarm's can be seen this way")


def gpu_cache_check(device: torch.device, cache_path: Path | None = None) -> Check:
    """Whether `join` will find this device's benchmark cached (in `cache_path`, by default where it looks), or
    measure it (or fail on a broken cache file)."""
    cache_path = cache_path or default_cache_path()
    key = cache_key(device)
    if not cache_path.exists():
        return Check("GPU probe cache", "warn", f"no benchmark cached yet ({cache_path})",
                     hint="the first join measures it (a few seconds)")
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError) as e:
        cache, error = None, _one_line(e)
    else:
        error = "not a JSON object"
    if not isinstance(cache, dict):
        return Check("GPU probe cache", "FAIL", f"{cache_path} is unreadable: {error}",
                     hint="delete it; the next join measures again")
    tflops = cache.get(key)
    if not isinstance(tflops, (int, float)):
        return Check("GPU probe cache", "warn", f"nothing cached for {key} in {cache_path}",
                     hint="the first join measures it, or `hetswarm join --throughput eval`")
    return Check("GPU probe cache", "ok", f"{tflops:.2f} TFLOPS cached for {key}")


def versions_check(peers: dict[str, PeerRecord]) -> Check:
    """Ours, and whether the peers in view run another hetswarm."""
    mine = {package: _version(package) for package in ("hetswarm", "hivemind", "torch")}
    detail = ", ".join(f"{package} {v}" for package, v in mine.items()) + f", Python {platform.python_version()}"
    others = Counter(record.version for record in peers.values() if record.version != mine["hetswarm"])
    if others:
        return Check("versions", "warn", detail + "; peers in view run hetswarm "
                     + ", ".join(f"{v} ({n})" for v, n in others.most_common()),
                     hint="run the version the swarm runs")
    if mine["hivemind"] != TESTED_HIVEMIND:
        return Check("versions", "warn", detail, hint=f"hetswarm is tested with hivemind {TESTED_HIVEMIND}")
    return Check("versions", "ok", detail)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
