"""The link probe on real p2p daemons: its pings overlap on a far link, within what the answering peer admits."""
from __future__ import annotations

import asyncio

import pytest
from hivemind.p2p import P2PContext
from hivemind.proto import runtime_pb2

from hetswarm.client.peer.link_probe import PINGS_IN_FLIGHT, ProbeConfig, ProbeServicer, measure_link
from tests.helpers.p2p_nodes import connected_p2ps

NAMESPACE = "probe.test"
ROUND_TRIP_S = 0.3


def far_servicer() -> ProbeServicer:
    """A probe servicer that answers each ping ROUND_TRIP_S late, as a peer across the world would, and counts the
    pings it holds at once (`most_held`)."""
    servicer = ProbeServicer(admits=lambda peer: True)
    servicer.holding = servicer.most_held = 0
    answer = servicer.rpc_ping

    async def rpc_ping(request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        servicer.holding += 1
        servicer.most_held = max(servicer.most_held, servicer.holding)
        try:
            await asyncio.sleep(ROUND_TRIP_S)
            return await answer(request, context)
        finally:
            servicer.holding -= 1

    servicer.rpc_ping = rpc_ping  # hivemind registers the instance's method under ProbeServicer's handle name
    return servicer


@pytest.mark.timeout(60)
def test_pings_overlap_up_to_the_limit_and_the_latency_is_still_the_round_trip():
    async def probe() -> tuple[ProbeServicer, float]:
        async with connected_p2ps(2) as (far, prober):
            servicer = far_servicer()
            await servicer.add_p2p_handlers(far, namespace=NAMESPACE)
            link = await measure_link(prober, far.peer_id, namespace=NAMESPACE,
                                      config=ProbeConfig(pings=8, ping_spacing_s=0.01, bandwidth_rounds=1))
            return servicer, link.latency_ms

    servicer, latency_ms = asyncio.run(probe())
    assert PINGS_IN_FLIGHT < servicer.pings.max_concurrent
    assert servicer.most_held == PINGS_IN_FLIGHT  # overlapping, never more at once than the limit
    assert not servicer.pings.refused
    assert latency_ms >= ROUND_TRIP_S / 2 * 1000
