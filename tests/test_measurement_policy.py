"""Sparse link measurement (protocol/measurement_policy.py): at most k links per peer, the plan's and the site's
first, a rotating sample of the rest; both ends of a pair choose alike, so the smaller id alone measures it."""
from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

import pydantic.v1 as pydantic
import pytest
from hivemind.utils import get_dht_time

from hetswarm.client.peer import link_prober
from hetswarm.client.peer.link_prober import LinkProber
from hetswarm.client.peer.volunteer import VolunteerConfig
from hetswarm.protocol.limits import MAX_REQUESTED_LINKS
from hetswarm.protocol.measurement_policy import expected_links, links_to_measure, pair_draw
from hetswarm.protocol.records import LinkMeasurement, LinkRequests
from tests.helpers.swarm_records import record

K = 16


def swarm(n: int, sites: int = 8) -> dict:
    peers = [f"Qm{index:044d}".translate(str.maketrans("0123456789", "abcdefghij")) for index in range(n)]
    return {peer: record(peer, site=f"site{index % sites}") for index, peer in enumerate(peers)}


def chosen(peers: dict, me: str, *, epoch: int = 0, partners=()) -> list[str]:
    return links_to_measure(me, peers, site=peers[me].site, partners=partners, budget=K, epoch=epoch)


def test_up_to_k_plus_one_peers_every_pair_is_measured_as_before():
    peers = swarm(K + 1)
    for me in peers:
        assert set(chosen(peers, me)) == set(peers) - {me}


def test_past_the_budget_each_peer_keeps_k_links_the_plans_and_a_few_of_its_sites_first():
    peers = swarm(200)
    me = next(iter(peers))
    partners = list(peers)[100:104]
    mine = chosen(peers, me, partners=partners)
    assert len(mine) == K and mine[:4] == sorted(partners, key=lambda peer: pair_draw(me, peer, 0))
    same_site = sorted((peer for peer in peers if peer != me and peers[peer].site == peers[me].site),
                       key=lambda peer: pair_draw(me, peer, 0))
    assert len(same_site) > K and mine[4:8] == same_site[:K // 4]  # a crowded site takes a quarter, no more
    assert sum(peers[peer].site != peers[me].site for peer in mine) >= K // 2  # the sample: other sites


def test_a_pair_is_chosen_by_both_ends_or_by_neither_until_a_budget_cuts_it():
    peers = swarm(120, sites=60)  # two peers per site: the sample, not the site, fills the budget
    picks = {me: set(links_to_measure(me, peers, site=peers[me].site, partners=(), budget=10 * K, epoch=3))
             for me in peers}
    assert all((b in picks[a]) == (a in picks[b]) for a, b in itertools.combinations(peers, 2))


def test_the_sample_rotates_so_that_measurements_cover_the_swarm():
    peers = swarm(200, sites=200)  # no two peers share a site: only the sample
    me = next(iter(peers))
    epochs = [set(chosen(peers, me, epoch=epoch)) for epoch in range(40)]
    assert epochs[0] != epochs[1]
    assert len(set().union(*epochs)) > 0.9 * (len(peers) - 1)  # 40 epochs of ~16: nearly every peer met
    measured_per_epoch = [sum(me < peer for peer in picks) for picks in epochs]  # only the smaller id probes
    assert max(measured_per_epoch) <= K


def test_the_first_round_the_coordinator_waits_for_is_what_the_policy_yields():
    """Every pair up to k+1 peers; past that, no more than the fewest pairs the policy measured in 20 draws."""
    assert expected_links(K + 1) == (K + 1) * K // 2
    for n in (24, 64):
        fewest = min(len({frozenset((me, other)) for me in peers for other in chosen(peers, me, epoch=epoch)
                          if me < other}) for epoch in range(20) for peers in [swarm(n)])
        assert n * K / 2 * 0.8 < expected_links(n) <= fewest


def test_link_requests_are_bounded_join_two_peers_and_name_what_each_peer_measures():
    a, b, c = sorted(swarm(3))
    requests = LinkRequests(coordinator_id=a, pairs=[(a, b), (c, b)], updated_at=0.0)
    assert requests.targets_of(a) == {b} and requests.targets_of(c) == {b} and not requests.targets_of(b)
    with pytest.raises(pydantic.ValidationError, match="two different peers"):
        LinkRequests(coordinator_id=a, pairs=[(a, a)], updated_at=0.0)
    with pytest.raises(pydantic.ValidationError, match="exceed the limit"):
        LinkRequests(coordinator_id=a, pairs=[(a, b)] * (MAX_REQUESTED_LINKS + 1), updated_at=0.0)


def test_a_peer_measures_the_link_it_is_asked_for_whichever_end_has_the_smaller_id(monkeypatch):
    """The coordinator names the end that measures an asked link (coordinator/measurement_wait.py): the peer with
    the largest id, which measures none of the links it chooses itself, probes the one it is asked for, and no
    other; a request that names the other end as measurer asks nothing of it."""
    peers = swarm(6)
    low, high = min(peers), max(peers)
    others = {peer: r for peer, r in peers.items() if peer != high}
    prober = LinkProber(SimpleNamespace(peer_id=high, p2p=None, config=SimpleNamespace(swarm="policy")),
                        VolunteerConfig())
    probed = []

    async def measure(_p2p, peer, **_options) -> LinkMeasurement:
        probed.append(peer.to_base58())
        return LinkMeasurement(latency_ms=1.0, bandwidth_mbps=1.0, measured_at=get_dht_time(), samples=1)

    monkeypatch.setattr(link_prober, "measure_link", measure)
    assert not asyncio.run(prober.round(others)) and not probed
    assert not prober.ask(LinkRequests(coordinator_id=low, pairs=[(low, high)], updated_at=0.0))
    assert prober.ask(LinkRequests(coordinator_id=low, pairs=[(high, low)], updated_at=0.0))
    assert asyncio.run(prober.round(others)) and probed == [low]


def test_a_link_asked_for_while_a_round_runs_is_probed_next_and_ends_the_round(monkeypatch):
    """A round of probes takes tens of seconds, and the coordinator holds its plan until the links it asked for are
    in: the prober chooses each probe after the last, and a round ends on an asked link, which the volunteer then
    publishes (client/peer/link_prober.py); the next round probes the rest."""
    peers = swarm(6)
    me, others = min(peers), {peer: r for peer, r in peers.items() if peer != min(peers)}
    node = SimpleNamespace(peer_id=me, p2p=None, config=SimpleNamespace(swarm="policy"))

    def probe_rounds(rounds: int, ask_after_first: str | None = None) -> list[list[str]]:
        prober, probed = LinkProber(node, VolunteerConfig()), []

        async def measure(_p2p, peer, **_options) -> LinkMeasurement:
            probed.append(peer.to_base58())
            if ask_after_first is not None and len(probed) == 1:
                prober.ask(LinkRequests(coordinator_id=me, pairs=[(me, ask_after_first)], updated_at=0.0))
            return LinkMeasurement(latency_ms=1.0, bandwidth_mbps=1.0, measured_at=get_dht_time(), samples=1)

        monkeypatch.setattr(link_prober, "measure_link", measure)
        by_round = []
        for _ in range(rounds):
            before = len(probed)
            assert asyncio.run(prober.round(others))
            by_round.append(probed[before:])
        return by_round

    [unasked] = probe_rounds(1)
    assert sorted(unasked) == sorted(others)
    assert probe_rounds(2, ask_after_first=unasked[-1]) == [[unasked[0], unasked[-1]], unasked[1:-1]]
