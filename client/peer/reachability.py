"""Can other peers dial this one? A joining peer asks peers in view to dial it back, as Petals' reachability.py does.

A peer behind NAT or a firewall can still reach out (join the DHT, publish, call others), so nothing fails at once;
it only shows later, when peers that have not connected to it yet cannot open a link to it (probes, activations,
all-reduce). So on `join` the client asks one or two peers in view to dial it back on the addresses it announces
and, when they answer that they cannot, says how to fix it. The checker dials from a fresh client-only p2pd (no
listening, no relay, an empty peer store): its own daemon is already connected to the asker (the question came
over that connection) and would reuse the link instead of proving that a new one can be made. The libp2p handshake
checks the peer id, so a checker only ever confirms the asker itself, whatever addresses it is given; but the
reason a dial failed would tell the asker what listens there. So a checker with a public address dials only public
ones: a stranger cannot make it probe its own loopback or LAN (a swarm on private addresses, as on one machine or in
a lab, dials them). Checkers on the asker's machine or LAN can dial addresses the internet cannot: a "yes" from them
proves less than a "no".

The same servicer tells its clock (`rpc_clock`), for `hetswarm doctor`: hivemind refuses peers whose clocks differ
by more than MAX_DHT_TIME_DISCREPANCY_SECONDS.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import time
from dataclasses import dataclass
from typing import Literal

from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import dht_pb2, runtime_pb2
from hivemind.utils import get_dht_time
from hivemind.utils.multiaddr import Multiaddr

from hetswarm.client.peer.emulation import EmulatedP2P
from hetswarm.client.peer.hivemind_compat import ControlFailure, P2PDaemonError, dial
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.keys import short_id
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.rpc_messages import (
    DETAIL_CHARS,
    MAX_DIAL_MADDRS,
    DialBackAnswer,
    DialBackRequest,
    encode_message,
    read_message,
)

logger = logging.getLogger(__name__)

MAX_CONCURRENT_CHECKS = 2
"""Dial-backs one peer runs at once (each starts a p2pd for a few seconds); more are answered `busy`."""
PROBE_STARTUP_TIMEOUT_S = 8.0
DIAL_TIMEOUT_S = 5.0
ASK_TIMEOUT_S = PROBE_STARTUP_TIMEOUT_S + DIAL_TIMEOUT_S + 3.0
"""The asker's deadline for one answer: the checker's probe start-up and dial, plus the round trip."""

_PROBE_P2P_ARGS = dict(dht_mode="client", auto_nat=False, nat_port_map=False, use_relay=False, no_listen=True,
                       conn_manager=False, startup_timeout=PROBE_STARTUP_TIMEOUT_S)
"""A daemon that only dials out, directly, with nobody to learn addresses from (Petals' PROBE_P2P_ARGS)."""


@dataclass(frozen=True, slots=True)
class DialBack:
    """A checker's answer: True it connected, False it could not; None it did not try (busy, bad request)."""

    reachable: bool | None
    detail: str

    def to_response(self) -> runtime_pb2.ExpertResponse:
        return runtime_pb2.ExpertResponse(metadata=encode_message(
            DialBackAnswer(reachable=self.reachable, detail=self.detail[:DETAIL_CHARS])))

    @classmethod
    def from_response(cls, response: runtime_pb2.ExpertResponse) -> DialBack:
        """The answer of a checker, which may be anything: a malformed one counts as no answer."""
        try:
            answer = read_message(DialBackAnswer, response.metadata)
        except RejectedInput:
            return cls(None, "malformed answer")
        return cls(answer.reachable, answer.detail)


def direct_tcp_maddr(text: str, peer: PeerID, *, public_only: bool = False) -> Multiaddr | None:
    """`text` as a dialable /ip4|ip6/HOST/tcp/PORT, or None: relays, DNS names, unspecified hosts and addresses of
    another peer are never dialled on a peer's behalf, nor, with `public_only`, loopback and private ones."""
    try:
        maddr = Multiaddr(text)
        names = [protocol.name for protocol in maddr.protocols()]
        if names[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]) or names[2:] not in ([], ["p2p"]):
            return None
        host = maddr.value_for_protocol(names[0])
        if host in ("0.0.0.0", "::") or (public_only and not ipaddress.ip_address(host).is_global):
            return None
        if names[2:] == ["p2p"]:
            if maddr.value_for_protocol("p2p") != peer.to_base58():
                return None
            maddr = maddr.decapsulate(Multiaddr(f"/p2p/{peer.to_base58()}"))
        return maddr
    except Exception:  # py-multiaddr raises several types on garbage
        return None


def has_public_address(maddrs: list[str]) -> bool:
    """Whether any of these (a peer's own visible addresses) is a public IP address."""
    for text in maddrs:
        try:
            maddr = Multiaddr(text)
            if ipaddress.ip_address(maddr.value_for_protocol(maddr.protocols()[0].name)).is_global:
                return True
        except Exception:  # not an IP address (a DNS name, garbage): not public as far as we can tell
            continue
    return False


def dial_error_text(error: ControlFailure) -> str:
    """p2pd's multi-line "all dials failed" as one line: the reason given for each address."""
    lines = [line.strip(" *") for line in str(error).splitlines()]
    return "; ".join(line for line in lines[1:] if line) or lines[0]


async def dial_back(peer: PeerID, maddrs: list[Multiaddr], *, dial_timeout_s: float = DIAL_TIMEOUT_S) -> DialBack:
    """Opens a new connection to `peer` on `maddrs` from a throw-away client-only daemon (module docstring)."""
    try:
        probe = await P2P.create(**_PROBE_P2P_ARGS)  # bounded by its startup_timeout; ends its p2pd on failure
    except P2PDaemonError as e:
        logger.warning(f"Could not start a p2p daemon to dial {short_id(peer.to_base58())} back: {e}")
        return DialBack(None, "the checker could not start a probe daemon")
    try:
        start = time.perf_counter()
        async with asyncio.timeout(dial_timeout_s):
            await dial(probe, peer, maddrs)
        return DialBack(True, f"connected in {(time.perf_counter() - start) * 1000:.0f} ms")
    except ControlFailure as e:
        return DialBack(False, dial_error_text(e))
    except TimeoutError:
        return DialBack(False, f"no connection within {dial_timeout_s:.0f} s (a firewall that drops packets?)")
    finally:
        await probe.shutdown()


class ReachabilityServicer(ServicerBase):
    """Dials askers back and tells its clock; namespaced per swarm (protocol.keys.reachability_namespace)."""

    def __init__(self, *, public_only: bool, dial_timeout_s: float = DIAL_TIMEOUT_S,
                 max_concurrent: int = MAX_CONCURRENT_CHECKS):
        """
        Args:
            public_only: dial only public addresses (module docstring); True for a checker with a public address.
        """
        if dial_timeout_s <= 0 or max_concurrent < 1:
            raise ValueError(f"need dial_timeout_s > 0 and max_concurrent >= 1, got {dial_timeout_s}, {max_concurrent}")
        self.public_only, self.dial_timeout_s = public_only, dial_timeout_s
        self._checks = asyncio.Semaphore(max_concurrent)

    async def rpc_check_reachability(self, request: runtime_pb2.ExpertRequest,
                                     context: P2PContext) -> runtime_pb2.ExpertResponse:
        """Dials the asker (never anyone else: context.remote_id is authenticated) on the addresses it lists."""
        asker = context.remote_id
        try:
            try:
                listed = read_message(DialBackRequest, request.metadata).maddrs
            except RejectedInput as e:
                return DialBack(None, f"bad request: {e}").to_response()
            targets = [m for m in (direct_tcp_maddr(text, asker, public_only=self.public_only) for text in listed) if m]
            if not targets:
                kind = "public " if self.public_only else ""
                return DialBack(False, f"it announces no direct {kind}/ip4|ip6/HOST/tcp/PORT address").to_response()
            if self._checks.locked():
                return DialBack(None, "busy").to_response()
            async with self._checks:
                answer = await dial_back(asker, targets, dial_timeout_s=self.dial_timeout_s)
            logger.debug(f"Dialled {short_id(asker.to_base58())} back on {[str(m) for m in targets]}: {answer}")
            return answer.to_response()
        except Exception as e:  # never the asker's problem to crash us; CancelledError passes
            logger.debug(f"Dial-back for {asker} failed", exc_info=True)
            return DialBack(None, f"internal error: {type(e).__name__}").to_response()

    async def rpc_clock(self, request: dht_pb2.PingRequest, context: P2PContext) -> dht_pb2.PingResponse:
        return dht_pb2.PingResponse(dht_time=get_dht_time())


async def ask_dial_back(p2p: P2P | EmulatedP2P, checker: PeerID, *, namespace: str, maddrs: list[str],
                        timeout_s: float = ASK_TIMEOUT_S) -> DialBack:
    """`checker`'s answer to "dial me back on `maddrs`"; a checker that does not answer gives DialBack(None, why)."""
    stub = ReachabilityServicer.get_stub(p2p, checker, namespace=namespace)
    request = runtime_pb2.ExpertRequest(metadata=encode_message(DialBackRequest(maddrs=maddrs[:MAX_DIAL_MADDRS])))
    try:
        async with asyncio.timeout(timeout_s):
            return DialBack.from_response(await stub.rpc_check_reachability(request))
    except TimeoutError:
        return DialBack(None, f"no answer within {timeout_s:.0f} s")
    except Exception as e:  # P2PHandlerError (an old peer without the handler), P2PDaemonError, ControlFailure
        logger.debug(f"Asking {checker} to dial us back failed", exc_info=True)
        return DialBack(None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:DETAIL_CHARS])


@dataclass(frozen=True, slots=True)
class ClockReading:
    """A peer's clock minus ours, from one round trip: the error is at most half the round trip."""

    peer: str
    offset_s: float
    rtt_s: float


async def ask_clock(p2p: P2P | EmulatedP2P, peer: PeerID, *, namespace: str,
                    timeout_s: float = 5.0) -> ClockReading | None:
    """`peer`'s clock against ours (NTP's midpoint estimate), or None if it did not answer in time."""
    stub = ReachabilityServicer.get_stub(p2p, peer, namespace=namespace)
    try:
        async with asyncio.timeout(timeout_s):
            sent = get_dht_time()
            response = await stub.rpc_clock(dht_pb2.PingRequest())
            received = get_dht_time()
    except Exception:  # TimeoutError, P2PHandlerError, P2PDaemonError, ControlFailure
        logger.debug(f"Clock query to {peer} failed", exc_info=True)
        return None
    return ClockReading(peer.to_base58(), response.dht_time - (sent + received) / 2, received - sent)


Verdict = Literal["reachable", "unreachable", "unknown"]


@dataclass(frozen=True, slots=True)
class Reachability:
    """What the peers asked said: reachable if any could dial us, unreachable if some tried and none could."""

    verdict: Verdict
    detail: str
    maddrs: tuple[str, ...] = ()


async def check_reachability(p2p: P2P | EmulatedP2P, records: SwarmRecords, *, me: str, namespace: str,
                             max_checkers: int = 2, wait_for_peers_s: float = 12.0, poll_s: float = 2.0,
                             ask_timeout_s: float = ASK_TIMEOUT_S) -> Reachability:
    """Asks up to `max_checkers` peers in view (waiting up to `wait_for_peers_s` for one to appear) to dial us back.

    Bounded by wait_for_peers_s + ask_timeout_s + one DHT read; never raises but CancelledError.
    """
    try:
        async with asyncio.timeout(wait_for_peers_s + ask_timeout_s + records.timeout_s):
            maddrs = [str(m) for m in await p2p.get_visible_maddrs(latest=True)]
            deadline = time.monotonic() + wait_for_peers_s
            while True:
                try:
                    others = [peer for peer, record in (await records.peers()).items()
                              if peer != me and record.state != "leaving"]
                except TimeoutError:
                    others = []
                if others or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(min(poll_s, max(deadline - time.monotonic(), 0)))
            if not others:
                return Reachability("unknown", "no other peer in view to ask yet", tuple(maddrs))
            checkers = random.sample(others, min(max_checkers, len(others)))  # spread the work over the swarm
            answers = await asyncio.gather(*[
                ask_dial_back(p2p, PeerID.from_base58(peer), namespace=namespace, maddrs=maddrs,
                              timeout_s=ask_timeout_s) for peer in checkers])
    except TimeoutError:
        return Reachability("unknown", "the check ran out of time", ())
    except Exception as e:  # the check is advice: it never takes the peer down
        logger.debug("Reachability check failed", exc_info=True)
        return Reachability("unknown", f"the check failed ({type(e).__name__})", ())
    said = [f"{short_id(peer)}: {answer.detail}" for peer, answer in zip(checkers, answers)]
    if any(answer.reachable is True for answer in answers):
        verdict: Verdict = "reachable"
    elif any(answer.reachable is False for answer in answers):
        verdict = "unreachable"
    else:
        verdict = "unknown"
    return Reachability(verdict, "; ".join(said), tuple(maddrs))


def unreachable_advice(maddrs: tuple[str, ...] | list[str]) -> str:
    """What to do when peers cannot dial us: the options `join` has (it has no relay or client-only mode)."""
    shown = ", ".join(maddrs[:4]) or "(none)"
    return (f"Other peers cannot connect to this peer at {shown}. It can still reach out, but peers it has not "
            "connected to yet cannot open links to it (probes, activations, all-reduce). To fix: listen on a fixed "
            "port with --host-maddrs /ip4/0.0.0.0/tcp/PORT, forward TCP PORT to this machine on your router and "
            "firewall, and pass --announce-maddrs /ip4/PUBLIC_IP/tcp/PORT so that peers dial your public address; "
            "then check with `hetswarm doctor` and the same options.")


async def report_reachability(p2p: P2P | EmulatedP2P, records: SwarmRecords, *, me: str, namespace: str,
                              wait_for_peers_s: float = 12.0) -> Reachability:
    """The check `join` runs in the background once it is up: the verdict as a log line, the advice as a warning."""
    result = await check_reachability(p2p, records, me=me, namespace=namespace, wait_for_peers_s=wait_for_peers_s)
    if result.verdict == "reachable":
        logger.info(f"Reachability: ok, peers can dial this peer back ({result.detail})")
    elif result.verdict == "unreachable":
        logger.warning(f"Reachability: NOT reachable ({result.detail}). {unreachable_advice(result.maddrs)}")
    else:
        logger.info(f"Reachability: cannot check yet ({result.detail})")
    return result
