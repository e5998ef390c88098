"""Floods on real p2p daemons: a stranger's bandwidth probes, one peer's probe storm or state questions, and a
stream message that claims a gigabyte are each cut off at once, while the peer keeps serving
(client/peer/peer_gate.py)."""
from __future__ import annotations

import asyncio

import pytest
from hivemind.p2p import P2P
from hivemind.proto import runtime_pb2

from hetswarm.client.peer.hivemind_compat import bound_stream_messages, unbound_stream_messages
from hetswarm.client.peer.link_probe import SMALL_PROBE_BYTES, ProbeConfig, ProbeServicer, _stream_time, measure_link
from hetswarm.client.training.state_server import StateServer, StateStore
from hetswarm.protocol.rpc_messages import StateInfo, StateInfoRequest, encode_message
from tests.helpers.p2p_nodes import connected_p2ps

NAMESPACE = "flood.probe"
pytestmark = [pytest.mark.swarm, pytest.mark.timeout(60)]


async def _serve(p2p: P2P, in_view: set[str]) -> ProbeServicer:
    servicer = ProbeServicer(admits=lambda peer: peer in in_view)
    await servicer.add_p2p_handlers(p2p, namespace=NAMESPACE)
    return servicer


def test_a_stranger_cannot_make_a_peer_absorb_probes_but_a_peer_in_view_can(caplog):
    async def scenario() -> tuple[str, float, dict]:
        async with connected_p2ps(3) as (server, friend, stranger):
            servicer = await _serve(server, {friend.peer_id.to_base58()})
            refused = ""
            try:
                await _stream_time(ProbeServicer.get_stub(stranger, server.peer_id, namespace=NAMESPACE),
                                   SMALL_PROBE_BYTES)
            except ConnectionError as e:
                refused = str(e)
            measured = await measure_link(friend, server.peer_id, namespace=NAMESPACE,
                                          config=ProbeConfig(pings=2, bandwidth_rounds=1, max_payload_bytes=2**20))
            return refused, measured.bandwidth_mbps, dict(servicer.payloads.refused)

    refused, bandwidth, counts = asyncio.run(scenario())
    assert refused  # a ConnectionError: the verdict, a stream cut off unread, or a broken pipe, as timing has it
    assert any("not a peer of this swarm in view" in r.getMessage() for r in caplog.records)
    assert bandwidth > 0
    assert list(counts.values()) == [1]  # the stranger, once; the friend was never refused


def test_a_probe_storm_is_cut_off_after_its_burst(caplog):
    async def scenario() -> tuple[int, int, str]:
        async with connected_p2ps(2) as (server, prober):
            servicer = await _serve(server, {prober.peer_id.to_base58()})
            stub = ProbeServicer.get_stub(prober, server.peer_id, namespace=NAMESPACE)
            taken = 0
            last = ""
            for _ in range(40):  # bounded: 40 small payloads as fast as they go
                try:
                    await _stream_time(stub, SMALL_PROBE_BYTES)
                    taken += 1
                except ConnectionError as e:
                    last = str(e)
            return taken, sum(servicer.payloads.refused.values()), last

    taken, refused, last = asyncio.run(scenario())
    burst = 12
    assert burst <= taken <= burst + 2 and taken + refused == 40  # a few tokens refill while it storms
    assert last and any("calls per second" in r.getMessage() for r in caplog.records)


def test_a_stream_message_claiming_a_gigabyte_is_cut_off_unread_and_the_peer_keeps_serving():
    bound_stream_messages()

    async def scenario() -> tuple[bytes, float]:
        async with connected_p2ps(2) as (server, attacker):
            await _serve(server, {attacker.peer_id.to_base58()})
            handle = f"{NAMESPACE}::ProbeServicer.rpc_absorb"
            _, reader, writer = await attacker.call_binary_stream_handler(server.peer_id, handle)
            writer.write(P2P.MESSAGE_MARKER + (2**30).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + bytes(65536))
            await writer.drain()
            loop = asyncio.get_running_loop()
            start = loop.time()
            async with asyncio.timeout(20):
                rest = await reader.read()  # the server closes the stream instead of waiting for a gigabyte
            closed_after = loop.time() - start
            writer.close()
            stub = ProbeServicer.get_stub(attacker, server.peer_id, namespace=NAMESPACE)
            assert (await stub.rpc_ping(runtime_pb2.ExpertRequest())).metadata == b""  # still serving
            return rest, closed_after

    try:
        rest, closed_after = asyncio.run(scenario())
    finally:
        unbound_stream_messages()  # the other tests of this worker read with hivemind's own reader
    assert closed_after < 10


def test_a_peer_that_keeps_asking_for_state_is_answered_nothing_past_its_burst(caplog):
    """Each state question may make a peer read a checkpoint from disk: one peer's questions are bounded."""
    async def scenario() -> tuple[int, int]:
        async with connected_p2ps(2) as (server_p2p, asker):
            server = StateServer(server_p2p, StateStore(), namespace="flood.state")
            await server.attach()
            stub = StateServer.get_stub(asker, server_p2p.peer_id, namespace="flood.state")
            question = runtime_pb2.ExpertRequest(metadata=encode_message(StateInfoRequest(step=1, units=["embed"])))
            nothing_held = encode_message(StateInfo(held={}))
            answered = 0
            for _ in range(60):  # bounded: 60 questions as fast as they go
                answered += (await stub.rpc_state_info(question)).metadata == nothing_held
            return answered, sum(server.questions.refused.values())

    answered, refused = asyncio.run(scenario())
    assert 32 <= answered <= 34 and answered + refused == 60  # the burst, and the few tokens that refilled
    assert any("state question" in r.getMessage() and "calls per second" in r.getMessage() for r in caplog.records)
