"""A bootstrap node and four `hetswarm join` processes on 127.0.0.1, watched by `hetswarm monitor --json`.

The tests share one swarm (module fixture) and run in file order: the clients appear with hardware figures (one
emulating a slower device: `--emulate-tflops`) and measured links, the emulated links are measured within 10 %, a SIGINT shows `leaving`, a SIGKILL disappears
within the record expiry, and no process is left behind.
"""
from __future__ import annotations

import signal
import time

import pytest

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.emulation import SiteLinks
from tests.helpers.waiting import pids_left

SCENARIO = "worldwide"
SITES = {"oregon": "Oregon", "virginia": "Virginia", "tokyo": "Tokyo", "london": "London"}  # 3 regions
BANDWIDTH_SCALE = 0.05
EMULATED = {"virginia": 0.001}
"""Clients that emulate a slower device, and its TFLOPS (below any CPU's)."""
TTL_S = 10.0
pytestmark = [pytest.mark.swarm, pytest.mark.timing, pytest.mark.timeout(300)]


def by_name(snapshot: dict) -> dict[str, dict]:
    return {peer["name"]: peer for peer in snapshot["peers"]}


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with LocalSwarm("jointest", workdir=tmp_path_factory.mktemp("swarm"), preimported=True) as swarm:
        swarm.start_bootstrap()
        for name, site in SITES.items():
            emulated = ("--emulate-tflops", str(EMULATED[name])) if name in EMULATED else ()
            swarm.start_client(name, "--emulate", SCENARIO, "--site", site, "--bandwidth-scale", str(BANDWIDTH_SCALE),
                               "--ttl", str(TTL_S), *emulated)
        yield swarm


@pytest.fixture(scope="module")
def settled(swarm) -> dict:
    def everyone_measured(s: dict) -> bool:
        return s["counts"]["peers"] == len(SITES) and s["counts"]["pairs_measured"] == s["counts"]["pairs"]
    return swarm.poll(everyone_measured, timeout_s=150)


def test_monitor_lists_every_client_with_hardware_and_a_link_for_every_pair(settled):
    peers = by_name(settled)
    assert set(peers) == set(SITES)
    assert all(p["state"] == "ready" and p["tflops"] > 0 and p["memory_gib"] > 0 for p in peers.values())
    assert {name: peers[name]["tflops"] for name in EMULATED} == EMULATED
    assert all(peers[name]["tflops"] > 10 * max(EMULATED.values()) for name in set(SITES) - set(EMULATED))
    assert settled["counts"]["pairs_measured"] == settled["counts"]["pairs"] == 6


def test_emulated_links_are_measured_within_ten_percent(settled):
    links = SiteLinks.from_scenario(SCENARIO, bandwidth_scale=BANDWIDTH_SCALE)
    site_of = {p["peer_id"]: p["site"] for p in settled["peers"]}
    assert len(settled["links"]) >= 6
    for link in settled["links"]:
        latency_ms, bandwidth_mbps = links.link(site_of[link["src"]], site_of[link["dst"]])
        assert abs(link["latency_ms"] - latency_ms) <= max(0.1 * latency_ms, 2.0), link
        assert abs(link["bandwidth_mbps"] - bandwidth_mbps) <= 0.1 * bandwidth_mbps, link


def test_a_client_stopped_with_sigint_shows_leaving_and_exits(swarm, settled):
    tokyo = next(p for p in swarm.peers if p.name == "tokyo")
    tokyo.signal(signal.SIGINT)
    snapshot = swarm.poll(lambda s: by_name(s).get("tokyo", {}).get("state") == "leaving", timeout_s=TTL_S)
    assert by_name(snapshot)["tokyo"]["state"] == "leaving"
    assert tokyo.process.wait(timeout=20) == 0
    assert pids_left(tokyo) == []


def test_a_killed_client_disappears_within_its_expiry(swarm, settled):
    london = next(p for p in swarm.peers if p.name == "london")
    london.remember_tree()
    london.process.kill()
    killed_at = time.monotonic()
    snapshot = swarm.poll(lambda s: "london" not in by_name(s), timeout_s=TTL_S + 15)
    assert "london" not in by_name(snapshot)
    assert time.monotonic() - killed_at <= TTL_S + 15
    london.kill()  # reaps by PID whatever of its tree is left (OwnedDHT should have ended it already)


def test_no_process_is_left_behind(swarm):
    swarm.close()
    assert [pid for peer in swarm.peers for pid in peer.alive_pids()] == []
