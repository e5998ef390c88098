"""Link emulation arithmetic: one transmitter per destination, latency added once per message."""
from __future__ import annotations

import asyncio

import pytest

from hetswarm.client.peer.emulation import LinkShaper, SiteLinks
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.network import load_network


@pytest.fixture(scope="module")
def links() -> SiteLinks:
    return SiteLinks.from_scenario("worldwide", bandwidth_scale=0.5)


def test_site_links_follow_the_scenario_table_and_scale_bandwidth(links):
    network = load_network("worldwide")
    tokyo, london = network.sites.index("Tokyo"), network.sites.index("London")
    assert links.link("Tokyo", "London") == (network.latency_ms[tokyo, london],
                                             network.bandwidth_gbps[tokyo, london] * 1000 * 0.5)
    assert links.link("Tokyo", "Tokyo") == (5.0, 2.0 * 1000 * 0.5)  # two devices inside one region
    assert len(links.sites) == 8


@pytest.mark.timing
def test_messages_queue_for_the_link_and_pay_latency_once_each(links):
    sites = {"tokyo-peer": "Tokyo", "london-peer": "London"}

    async def site_of(peer):
        return sites.get(peer)

    async def arrivals():
        shaper = LinkShaper(links, "Tokyo", site_of)
        now = asyncio.get_running_loop().time()
        times = [await shaper.arrival_time("london-peer", 1_000_000) for _ in range(3)]
        return now, times, await shaper.arrival_time("nobody", 10)

    now, times, unknown = asyncio.run(arrivals())
    latency_s = links.link("Tokyo", "London")[0] / 1000
    per_message_s = 1_000_000 * 8 / (links.link("Tokyo", "London")[1] * 1e6)
    for i, arrival in enumerate(times, start=1):
        assert arrival - now == pytest.approx(i * per_message_s + latency_s, abs=5e-3)
    assert unknown is None  # a peer of unknown site is not delayed


def test_unknown_site_and_bad_scale_are_refused(links):
    with pytest.raises(HetswarmError, match="unknown site 'Atlantis'"):
        links.check_site("Atlantis")
    with pytest.raises(HetswarmError, match="bandwidth scale must be positive"):
        SiteLinks.from_scenario("worldwide", bandwidth_scale=0)
