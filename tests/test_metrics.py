"""`--metrics-port`: Prometheus metrics read from the live objects, served over HTTP on 127.0.0.1.

The collectors first, on objects made by hand: figures come from the objects as they are at scrape time, absent
counters are exported as 0, a section whose object misbehaves does not take the others down, and units are
Prometheus's (seconds, bytes per second). Then the real thing: the observed swarm's coordinator and two training
clients (tests/helpers/shared_swarm.py), processes each serving its metrics; two scrapes some seconds apart show
training going on, and the coordinator its plan.
"""
from __future__ import annotations

import asyncio
import time
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from hetswarm.client.cli.options import metrics_address
from hetswarm.client.peer.addresses import MetricsAddress
from hetswarm.client.peer.metrics import ClientCollector, CoordinatorCollector, beside, serve_metrics
from hetswarm.protocol.errors import ConfigError, HetswarmError, RejectedInput
from hetswarm.protocol.records import PeerRole, Progress
from tests.helpers.shared_swarm import CLIENTS, ObservedSwarm
from tests.helpers.swarm_records import IDS, link, record
from tests.helpers.waiting import wait_until

ME, OTHER, THIRD = IDS[0], IDS[1], IDS[2]


def collect(collector) -> dict[str, list[Sample]]:
    """Every sample of one collect(), by sample name (counters as `..._total`)."""
    found: dict[str, list[Sample]] = {}
    for family in collector.collect():
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float | None:
    """The one sample of `name` with these labels; None when there is none."""
    matching = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) <= 1, f"{name}{labels}: {matching}"
    return matching[0] if matching else None


def plan(version: int = 3) -> SimpleNamespace:
    """What the collectors read of an Assignment."""
    return SimpleNamespace(version=version, predicted_step_s=0.5, d_pp=2, d_dp=1, pipelines=[[OTHER, ME]],
                           roles={ME: PeerRole(stage=1, replica=0), OTHER: PeerRole(stage=0, replica=0)})


def volunteer(**overrides) -> SimpleNamespace:
    attributes = dict(node=SimpleNamespace(peer_id=ME), state="ready", follower=SimpleNamespace(current=plan(),
                      role=PeerRole(stage=1, replica=0)), links={OTHER: link(10.0, 8.0)},
                      peers={OTHER: record(OTHER, state="training"), THIRD: record(THIRD, state="joining")})
    return SimpleNamespace(**attributes | overrides)


def report(**overrides) -> SimpleNamespace:
    """A StepReport's fields, as stage_worker.py has them."""
    return SimpleNamespace(**dict(step=7, loss=4.5, compute_s=0.2, wait_s=0.1, wall_s=0.4, tokens=800,
                                  tokens_per_s=2000.0, attempt=0, retries=3, resyncs=1) | overrides)


# ---- what a client exports ----

def test_a_client_exports_its_last_step_its_plan_its_links_and_the_peers_it_sees():
    samples = collect(ClientCollector(volunteer(), SimpleNamespace(last_report=report(), assignment=plan())))
    assert value(samples, "hetswarm_step") == 7
    assert value(samples, "hetswarm_loss") == 4.5
    assert value(samples, "hetswarm_tokens_per_second") == 2000.0
    assert (value(samples, "hetswarm_step_compute_seconds"), value(samples, "hetswarm_step_wait_seconds")) == (0.2, 0.1)
    assert value(samples, "hetswarm_measured_step_seconds") == 0.4
    assert value(samples, "hetswarm_step_retries_total") == 3
    assert value(samples, "hetswarm_replica_resyncs_total") == 1
    assert value(samples, "hetswarm_assignment_version") == 3
    assert value(samples, "hetswarm_predicted_step_seconds") == 0.5
    assert value(samples, "hetswarm_role", stage="1", replica="0") == 1
    assert value(samples, "hetswarm_link_latency_seconds", src=ME, dst=OTHER) == pytest.approx(0.010)
    assert value(samples, "hetswarm_link_bandwidth_bytes_per_second", src=ME, dst=OTHER) == pytest.approx(1e6)
    # the two peers in view and this one, which is training (ready, with a role)
    assert {s.labels["state"]: s.value for s in samples["hetswarm_peers"]} == {
        "joining": 1, "ready": 0, "training": 2, "leaving": 0}


def test_counters_the_objects_do_not_have_yet_are_exported_as_zero():
    samples = collect(ClientCollector(volunteer(follower=None), None))  # no trainer, not following anyone
    assert value(samples, "hetswarm_step_retries_total") == 0
    assert value(samples, "hetswarm_handoffs_total") == 0
    assert value(samples, "hetswarm_assignment_version") == 0
    assert "hetswarm_step" not in samples  # a step nobody made is absent, not 0


def test_a_trainer_wide_counter_wins_over_the_last_reports():
    trainer = SimpleNamespace(last_report=report(retries=1), assignment=plan(), retries=9, handoffs=2)
    samples = collect(ClientCollector(volunteer(), trainer))
    assert value(samples, "hetswarm_step_retries_total") == 9
    assert value(samples, "hetswarm_handoffs_total") == 2


def test_a_section_that_cannot_be_read_leaves_the_others_served():
    broken = SimpleNamespace(state="ready", follower=None, links={}, peers={})  # no `node`: plan and swarm fail
    samples = collect(ClientCollector(broken, SimpleNamespace(last_report=report())))
    assert value(samples, "hetswarm_step") == 7
    assert "hetswarm_peers" not in samples


# ---- what the coordinator exports ----

def progress(peer: str, step: int, at: float, *, version: int = 3, loss: float | None = None,
             held_out_loss: float | None = None) -> Progress:
    return Progress(peer_id=peer, assignment_version=version, step=step, loss=loss, tokens_per_s=1.0, compute_s=0.1,
                    wait_s=0.0, updated_at=at, held_out_loss=held_out_loss,
                    held_out_step=None if held_out_loss is None else step)


def test_the_coordinator_exports_its_plan_the_members_progress_and_every_link_it_reads():
    collector = CoordinatorCollector(lambda: plan(version=3), records=None)
    collector.peers = {ME: record(ME, state="training", links={OTHER: link(20.0, 80.0)}),
                       OTHER: record(OTHER, state="training")}
    for at, step in ((100.0, 4), (102.0, 5), (106.0, 7)):  # 3 s a step, for both members
        collector.progress = {ME: progress(ME, step, at, loss=3.0), OTHER: progress(OTHER, step, at),
                              THIRD: progress(THIRD, 10**6, at)}  # not a member: ignored
        collector._remember(collector.progress)
    samples = collect(collector)
    assert value(samples, "hetswarm_assignment_version") == 3
    assert value(samples, "hetswarm_predicted_step_seconds") == 0.5
    assert value(samples, "hetswarm_step") == 7
    assert value(samples, "hetswarm_loss") == 3.0
    assert value(samples, "hetswarm_measured_step_seconds") == pytest.approx(2.0)
    assert value(samples, "hetswarm_peers", state="training") == 2
    assert value(samples, "hetswarm_link_bandwidth_bytes_per_second", src=ME, dst=OTHER) == pytest.approx(1e7)


def test_the_coordinator_exports_a_held_out_loss_only_when_two_pipelines_agree_on_it():
    two = SimpleNamespace(version=3, predicted_step_s=0.5, d_pp=1, d_dp=2, pipelines=[[ME], [OTHER]], eval_every=5,
                          roles={ME: PeerRole(stage=0, replica=0), OTHER: PeerRole(stage=0, replica=1)})
    collector = CoordinatorCollector(lambda: two, records=None)
    collector.peers = {}
    collector.progress = {ME: progress(ME, 9, 1.0, held_out_loss=2.5), OTHER: progress(OTHER, 9, 1.0, held_out_loss=2.5)}
    samples = collect(collector)
    assert (value(samples, "hetswarm_held_out_loss"), value(samples, "hetswarm_held_out_step")) == (2.5, 9)
    collector.progress[OTHER] = progress(OTHER, 9, 1.0, held_out_loss=0.01)  # one of them lies: nothing is believed
    assert "hetswarm_held_out_loss" not in collect(collector)


def test_a_coordinator_before_its_first_plan_says_version_zero():
    samples = collect(CoordinatorCollector(lambda: None, records=None))
    assert value(samples, "hetswarm_assignment_version") == 0
    assert "hetswarm_measured_step_seconds" not in samples


# ---- the server and the options ----

def scrape(url: str) -> dict[str, list[Sample]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


@pytest.mark.timeout(30)
def test_the_server_serves_a_registry_of_its_own_on_loopback_and_frees_its_port():
    server = serve_metrics(MetricsAddress(port=0))
    try:
        assert server.url.startswith("http://127.0.0.1:")
        server.register(ClientCollector(volunteer(), SimpleNamespace(last_report=report(), assignment=plan())))
        samples = scrape(server.url)
        assert value(samples, "hetswarm_step") == 7
        assert not [name for name in samples if name.startswith(("python_", "process_"))]  # a fresh registry
        with pytest.raises(HetswarmError, match="cannot serve metrics"):
            serve_metrics(MetricsAddress(port=server.port))  # taken
    finally:
        server.close()
    serve_metrics(MetricsAddress(port=server.port)).close()  # free again


def test_metrics_options_are_checked():
    assert metrics_address(None, "127.0.0.1") is None
    assert metrics_address(9100, "0.0.0.0") == MetricsAddress(port=9100, host="0.0.0.0")
    with pytest.raises(RejectedInput, match="--metrics-host only makes sense with --metrics-port"):
        metrics_address(None, "0.0.0.0")
    with pytest.raises(ConfigError):
        MetricsAddress(port=70000)


@pytest.mark.timeout(30)
def test_a_failing_loop_beside_main_is_logged_and_main_goes_on(caplog):
    async def main(stop: asyncio.Event) -> None:
        await asyncio.sleep(0.2)

    async def failing(stop: asyncio.Event) -> None:
        raise RuntimeError("boom")

    asyncio.run(beside(main, failing)(asyncio.Event()))
    assert "A metrics loop failed" in caplog.text


# ---- a real swarm ----

SCRAPE_GAP_S = 6.0


@pytest.fixture(scope="module")
def scrapes(observed_swarm: ObservedSwarm) -> dict:
    """The observed swarm (a coordinator and two clients training the tiny model, each with --metrics-port 0) scraped
    once both clients trained a step, and again some seconds later."""
    urls = observed_swarm.metrics_urls

    def all_trained_a_step() -> dict | None:
        found = {name: scrape(urls[name]) for name in CLIENTS}
        return found if all((value(s, "hetswarm_step") or 0) >= 1 for s in found.values()) else None

    first = wait_until("both clients to train a step", all_trained_a_step, 150)
    time.sleep(SCRAPE_GAP_S)
    second = {name: scrape(urls[name]) for name in CLIENTS}

    def coordinator_sees_both_training() -> dict | None:
        found = scrape(urls["coordinator"])
        return found if value(found, "hetswarm_peers", state="training") == 2 else None

    in_view = wait_until("the coordinator to see both clients training", coordinator_sees_both_training, 30)
    return {"first": first, "second": second, "coordinator": in_view}


@pytest.mark.timeout(240)
@pytest.mark.swarm
def test_a_training_clients_step_grows_between_two_scrapes(scrapes):
    for name in CLIENTS:
        before, after = scrapes["first"][name], scrapes["second"][name]
        assert value(after, "hetswarm_step") > value(before, "hetswarm_step"), name
        assert value(after, "hetswarm_tokens_per_second") > 0
        assert value(after, "hetswarm_measured_step_seconds") > 0
        assert value(after, "hetswarm_assignment_version") >= 1
        assert value(after, "hetswarm_step_retries_total") >= 0
    stages = {int(next(iter(scrapes["second"][n]["hetswarm_role"])).labels["stage"]) for n in CLIENTS}
    assert stages == {0, 1}
    # each pair's link is measured by its peer with the smaller id: between them, the clients export it once
    links = [s.labels for n in CLIENTS for s in scrapes["second"][n].get("hetswarm_link_latency_seconds", [])]
    assert len(links) == 1, links


@pytest.mark.timeout(240)
@pytest.mark.swarm
def test_the_coordinator_exports_its_plan_version_and_the_swarm_it_sees(scrapes):
    samples = scrapes["coordinator"]
    assert value(samples, "hetswarm_assignment_version") >= 1
    assert value(samples, "hetswarm_predicted_step_seconds") > 0
    assert value(samples, "hetswarm_plan_stages") == 2
    assert len(samples.get("hetswarm_link_latency_seconds", [])) >= 1
    assert value(samples, "hetswarm_step") >= 1
