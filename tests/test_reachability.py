"""Reachability: a peer asks others to dial it back, and `join` says how to fix it when nobody can.

The servicer is tested on real p2p daemons in this process (a reachable asker, an address nothing listens on, bad
requests); then `hetswarm join` processes on 127.0.0.1: a client whose --announce-maddrs points at a closed port is
told what to do, while the clients that can be dialled never are.
"""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import pytest
from hivemind.p2p import PeerID
from hivemind.proto import runtime_pb2

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.reachability import (
    DialBack,
    ReachabilityServicer,
    ask_clock,
    ask_dial_back,
    direct_tcp_maddr,
    has_public_address,
)
from hetswarm.protocol.keys import reachability_namespace
from tests.helpers.p2p_nodes import connected_p2ps

NAMESPACE = reachability_namespace("reachtest")
ADVICE = "--announce-maddrs /ip4/PUBLIC_IP/tcp/PORT"
NOT_REACHABLE = re.compile(r"Reachability: NOT reachable")
REPORT_WITHIN_S = 45.0
"""From `Joined swarm` to the verdict: up to 12 s waiting for a peer in view, then one dial-back round."""


def closed_port() -> int:
    """A port that was free a moment ago and that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flat(text: str) -> str:
    """Log text with rich's line wrapping undone."""
    return " ".join(text.split())


SOME_PEER = PeerID.from_base58("QmQ6eFsQ8xvTfyWMxkXHJ4rJ1yQ5ajcbK9ReKjECnaswkD")


@pytest.mark.parametrize("text, dialable", [
    ("/ip4/1.2.3.4/tcp/5", "/ip4/1.2.3.4/tcp/5"),
    (f"/ip4/1.2.3.4/tcp/5/p2p/{SOME_PEER.to_base58()}", "/ip4/1.2.3.4/tcp/5"),
    ("/ip6/::1/tcp/5", "/ip6/::1/tcp/5"),
    ("/ip4/1.2.3.4/tcp/5/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", None),  # another peer's address
    ("/ip4/0.0.0.0/tcp/5", None),
    ("/dns4/example.com/tcp/5", None),
    ("/ip4/1.2.3.4/udp/5/quic", None),
    (f"/ip4/1.2.3.4/tcp/5/p2p/{SOME_PEER.to_base58()}/p2p-circuit", None),
    ("garbage", None),
])
def test_only_direct_tcp_addresses_of_the_asker_are_dialled(text, dialable):
    maddr = direct_tcp_maddr(text, SOME_PEER)
    assert (str(maddr) if maddr else None) == dialable


@pytest.mark.parametrize("host, public", [("8.8.8.8", True), ("127.0.0.1", False), ("10.1.2.3", False),
                                          ("192.168.0.7", False), ("169.254.1.1", False), ("::1", False),
                                          ("2001:4860:4860::8888", True)])
def test_a_checker_with_a_public_address_dials_no_loopback_or_private_one(host, public):
    """A stranger could otherwise make it probe its own machine or LAN and read why each dial failed."""
    text = f"/{'ip6' if ':' in host else 'ip4'}/{host}/tcp/5"
    assert (direct_tcp_maddr(text, SOME_PEER, public_only=True) is not None) == public
    assert direct_tcp_maddr(text, SOME_PEER, public_only=False) is not None  # a swarm on private addresses dials them
    assert has_public_address(["/dns4/example.com/tcp/1", text]) == public


@pytest.mark.timeout(60)
@pytest.mark.swarm
def test_checker_dials_a_reachable_asker_back_and_refuses_a_closed_port():
    async def main() -> tuple[DialBack, DialBack]:
        async with connected_p2ps(2) as (checker, asker):
            await ReachabilityServicer(public_only=False).add_p2p_handlers(checker, namespace=NAMESPACE)
            own = [str(m) for m in await asker.get_visible_maddrs()]
            closed = [f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{asker.peer_id.to_base58()}"]
            return (await ask_dial_back(asker, checker.peer_id, namespace=NAMESPACE, maddrs=own),
                    await ask_dial_back(asker, checker.peer_id, namespace=NAMESPACE, maddrs=closed))

    reachable, closed = asyncio.run(main())
    assert reachable.reachable is True, reachable
    assert closed.reachable is False and "connection refused" in closed.detail, closed


@pytest.mark.timeout(60)
@pytest.mark.swarm
def test_bad_requests_get_an_answer_and_the_checker_keeps_serving():
    bad_requests = {
        "not JSON": b"\xc1\xc1\xc1",
        "not a list": b'{"maddrs": 1}',
        "not strings": b'{"maddrs": [1, 2]}',
        "oversized": json.dumps({"maddrs": ["/ip4/127.0.0.1/tcp/1"] * 400}).encode(),
    }

    async def main() -> tuple[dict[str, DialBack], DialBack, DialBack, float]:
        async with connected_p2ps(2) as (checker, asker):
            await ReachabilityServicer(public_only=False).add_p2p_handlers(checker, namespace=NAMESPACE)
            stub = ReachabilityServicer.get_stub(asker, checker.peer_id, namespace=NAMESPACE)
            answers = {name: DialBack.from_response(await stub.rpc_check_reachability(
                runtime_pb2.ExpertRequest(metadata=metadata), timeout=10)) for name, metadata in bad_requests.items()}
            # the checker's own address, claimed by the asker: never dialled on its behalf
            impostor = await ask_dial_back(asker, checker.peer_id, namespace=NAMESPACE,
                                           maddrs=[str(m) for m in await checker.get_visible_maddrs()])
            still = await ask_dial_back(asker, checker.peer_id, namespace=NAMESPACE,
                                        maddrs=[str(m) for m in await asker.get_visible_maddrs()])
            clock = await ask_clock(asker, checker.peer_id, namespace=NAMESPACE)
            return answers, impostor, still, clock.offset_s

    answers, impostor, still, offset_s = asyncio.run(main())
    assert all(answer.reachable is None for answer in answers.values()), answers
    assert impostor.reachable is False and "no direct" in impostor.detail, impostor
    assert still.reachable is True, still
    assert abs(offset_s) < 1.0  # one machine, one clock


@pytest.mark.timeout(60)
@pytest.mark.swarm
def test_a_peer_without_the_service_counts_as_no_answer():
    async def main() -> DialBack:
        async with connected_p2ps(2) as (checker, asker):
            return await ask_dial_back(asker, checker.peer_id, namespace=NAMESPACE, timeout_s=10,
                                       maddrs=[str(m) for m in await asker.get_visible_maddrs()])

    answer = asyncio.run(main())
    assert answer.reachable is None, answer


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """A bootstrap node, `alice` alone for a moment, then `bob` (announcing a closed port) and `carol` together."""
    with LocalSwarm("reachtest", workdir=tmp_path_factory.mktemp("swarm"), preimported=True) as swarm:
        swarm.start_bootstrap()
        swarm.start_client("alice").wait_for(re.compile("Joined swarm"), 90)
        swarm.start_client("bob", "--announce-maddrs", f"/ip4/127.0.0.1/tcp/{closed_port()}")
        swarm.start_client("carol")
        yield swarm


def peer(swarm: LocalSwarm, name: str):
    return next(p for p in swarm.peers if p.name == name)


@pytest.mark.timeout(180)
@pytest.mark.swarm
def test_a_client_nobody_can_dial_is_told_how_to_fix_it_and_keeps_running(swarm):
    bob = peer(swarm, "bob")
    bob.wait_for(re.compile("Joined swarm"), 90)
    joined_at = time.monotonic()
    bob.wait_for(NOT_REACHABLE, REPORT_WITHIN_S)
    assert time.monotonic() - joined_at <= REPORT_WITHIN_S
    advice = flat(bob.output())
    assert ADVICE in advice and "forward TCP PORT" in advice and "connection refused" in advice, advice[-2000:]
    assert bob.process.poll() is None  # advice, not an exit


@pytest.mark.timeout(180)
@pytest.mark.swarm
def test_a_client_that_can_be_dialled_is_confirmed_and_never_advised(swarm):
    carol = peer(swarm, "carol")
    carol.wait_for(re.compile("Joined swarm"), 90)
    carol.wait_for(re.compile("Reachability: ok"), REPORT_WITHIN_S)  # alice is in view: she dials carol back
    alice = peer(swarm, "alice")
    alice.wait_for(re.compile(r"Reachability: (ok|cannot check yet)"), REPORT_WITHIN_S)
    for client in (alice, carol):
        assert not NOT_REACHABLE.search(client.output()), client.output()[-2000:]
        assert ADVICE not in flat(client.output())


@pytest.mark.timeout(60)
@pytest.mark.swarm
def test_no_process_is_left_behind(swarm):
    swarm.close()
    assert [pid for p in swarm.peers for pid in p.alive_pids()] == []
