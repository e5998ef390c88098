"""The plan's own frames update the links a peer measures (client/peer/link_probe.py, `carried`): by the probe's
minimum-delay rule a frame can only show a link faster than measured, never slower, and a frame that took mostly the
link's latency says nothing of its bandwidth. A peer takes them only for links it measures (client/peer/link_prober.py).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetswarm.client.peer.link_probe import carried
from hetswarm.client.peer.link_prober import LinkProber
from hetswarm.client.peer.volunteer import VolunteerConfig
from hetswarm.protocol.limits import MAX_BANDWIDTH_MBPS
from hetswarm.protocol.records import LinkMeasurement
from tests.helpers.swarm_records import IDS

PROBED = LinkMeasurement(latency_ms=50.0, bandwidth_mbps=100.0, measured_at=1000.0, samples=8)
"""A probe's figures: 100 ms RTT, 100 Mbit/s."""
MB = 10**6


def test_a_frame_faster_than_the_probe_raises_the_bandwidth_to_what_it_carried():
    # 10 MB in 0.1 s of RTT plus 0.4 s of payload: 200 Mbit/s
    link = carried(PROBED, 10 * MB, 0.5)
    assert link.bandwidth_mbps == pytest.approx(200.0)
    assert (link.latency_ms, link.measured_at, link.samples) == (50.0, 1000.0, 8)  # the next probe is not put off


def test_a_frame_slower_than_the_probe_changes_nothing():
    # 10 MB in 1.1 s: 80 Mbit/s, slower than the probe's 100 (contention, or the receiver was busy)
    assert carried(PROBED, 10 * MB, 1.1) == PROBED


def test_a_frame_that_took_mostly_the_latency_leaves_the_bandwidth():
    # 1 MB in 0.12 s would read 400 Mbit/s, but 0.1 s of it is the RTT: the figure would be the latency's error
    assert carried(PROBED, MB, 0.12).bandwidth_mbps == PROBED.bandwidth_mbps


def test_a_frame_answered_within_the_probe_s_rtt_lowers_the_latency():
    link = carried(PROBED, 1000, 0.06)
    assert link.latency_ms == pytest.approx(30.0) and link.bandwidth_mbps == PROBED.bandwidth_mbps


def test_a_loopback_frame_is_capped_at_what_a_record_holds():
    fast = PROBED.copy(update={"latency_ms": 0.0})
    assert carried(fast, 10**9, 1e-6).bandwidth_mbps == MAX_BANDWIDTH_MBPS


@given(n_bytes=st.integers(0, 10**9), seconds=st.floats(0.0, 100.0),
       latency_ms=st.floats(0.0, 500.0), bandwidth_mbps=st.floats(0.01, 10**5))
def test_a_frame_never_shows_a_link_slower_or_farther(n_bytes, seconds, latency_ms, bandwidth_mbps):
    link = PROBED.copy(update={"latency_ms": latency_ms, "bandwidth_mbps": bandwidth_mbps})
    after = carried(link, n_bytes, seconds)
    assert after.bandwidth_mbps >= link.bandwidth_mbps and after.latency_ms <= link.latency_ms
    LinkMeasurement(**after.dict())  # still a valid record's link


def test_a_peer_takes_frames_only_on_the_links_it_measures():
    prober = LinkProber(SimpleNamespace(), VolunteerConfig())  # observe touches no node
    prober.links[IDS[1]] = PROBED
    prober.observe(IDS[1], 10 * MB, 0.5)
    prober.observe(IDS[2], 10 * MB, 0.5)  # the other end measures it, or nobody yet: no RTT to take off
    assert prober.links[IDS[1]].bandwidth_mbps == pytest.approx(200.0) and IDS[2] not in prober.links


def test_a_frame_whose_bytes_took_less_than_three_quarters_of_its_time_leaves_the_bandwidth():
    # 5 MB in 0.1 s of RTT plus 0.2 s of payload would read 200 Mbit/s; two thirds of the time is not enough
    assert carried(PROBED, 5 * MB, 0.3).bandwidth_mbps == PROBED.bandwidth_mbps
