"""Hand-off: a peer that takes a stage it does not hold downloads the state from the peers that do.

Every client serves, for as long as it runs, the states it holds (client/training/state_server.py).

The pattern is hivemind's ``load_state_from_peers`` / ``rpc_download_state`` (hivemind/optim/state_averager.py):
ask, then stream the state in bounded parts. Here the state is asked for unit by unit (embedding, block i, head;
client/training/stage_state.py), so that a stage of a new cut can be assembled from holders of the old one, and
several holders can serve different units at once. First every candidate says which of the units it holds at the
step, with the SHA-256 and size of each (``rpc_state_info``); for each unit the digest reported by the most holders
is chosen (ties: by a lottery no holder can rig, stage_state.majority_digest), each unit is streamed from one of its
holders (``rpc_state_unit``, 1 MiB parts, never more than the size announced), checked against the digest, and taken
from the next holder when it does not match or the holder fails. A resume names the roots of the checkpoints it
loads (Handoff.checkpoint_roots, recorded by the coordinator from their savers: coordinator/checkpoint_ledger.py):
then every unit's digest is the one a holder's digests of a whole checkpoint prove against its root, whatever most
holders say, so that a forged copy is never taken, however many peers offer it.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from hivemind import DHT
from hivemind.p2p import P2P, PeerID
from hivemind.proto import runtime_pb2

from hetswarm.client.training.errors import StageError, dial_failed
from hetswarm.client.training.stage_state import (
    StageState,
    decode_tensors,
    majority_digest,
    units_of_layers,
    units_root,
)
from hetswarm.client.training.state_server import StateServer, StateStore
from hetswarm.protocol.keys import state_namespace
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.records import Assignment, CheckpointRoot
from hetswarm.protocol.rpc_messages import (
    NewestState,
    StateInfo,
    StateInfoRequest,
    UnitRequest,
    encode_message,
    read_message,
)

__all__ = ["Agreement", "HandoffReport", "StateUnavailable", "agree_on_step", "fetch_model", "fetch_state",
           "unit_byte_limit"]

logger = logging.getLogger(__name__)

_INFO_ROUNDS, _INFO_PAUSE_S = 3, 2.0


class StateUnavailable(StageError):
    """No candidate holds some units of the state asked for."""


class _DownloadFailed(Exception):
    """A holder did not give a unit: why, and whether it could not be dialled at all (client/training/errors.py)."""

    def __init__(self, why: str, *, unreachable: bool = False) -> None:
        super().__init__(why)
        self.why, self.unreachable = why, unreachable


@dataclass(frozen=True, kw_only=True, slots=True)
class HandoffReport:
    """What a hand-off moved: logged, and shown by the monitor."""

    step: int
    bytes: int
    seconds: float
    sources: dict[str, int] = field(default_factory=dict)
    """Peer id → bytes it sent."""

    def describe(self) -> str:
        origin = ", ".join(f"{peer[-6:]}: {size} B" for peer, size in self.sources.items()) or "this peer"
        return f"{self.bytes} bytes in {self.seconds:.2f} s from {origin}"


def unit_byte_limit(model: ModelConfig, unit: str) -> int:
    """Largest honest encoding of a unit: fp32 parameters and two fp32 AdamW moments, plus headers."""
    params = {"embed": model.embedding_params, "head": model.head_params}.get(unit, model.params_per_layer)
    return 3 * 4 * params + 64 * 1024


async def fetch_state(p2p: P2P, candidates: Sequence[PeerID], *, step: int, units: Sequence[str],
                      model: ModelConfig, namespace: str, timeout_s: float, roots: Sequence[CheckpointRoot] = ()
                      ) -> tuple[StageState, HandoffReport]:
    """The state of ``units`` ready for ``step``, from the candidates that hold it (module docstring); with
    ``roots``, only the checkpoints they prove.

    Raises:
        StateUnavailable: some unit is held by no candidate, or every holder of it failed.
    """
    started = time.perf_counter()
    candidates = [peer for peer in dict.fromkeys(candidates) if peer != p2p.peer_id]
    for attempt in range(_INFO_ROUNDS):  # a source that is still starting up answers a moment later
        holders = await _holders(p2p, candidates, step=step, units=units, namespace=namespace, timeout_s=timeout_s,
                                 roots=roots, n_layers=model.n_layers)
        if missing := [unit for unit in units if unit not in holders]:
            if attempt + 1 < _INFO_ROUNDS:
                await asyncio.sleep(_INFO_PAUSE_S)
        else:
            break
    if missing:
        proof = " in the checkpoints whose roots the plan names" if roots else ""
        raise StateUnavailable(f"no peer holds {', '.join(missing)} of the state for step {step}{proof} "
                               f"(asked {len(candidates)} peers, {_INFO_ROUNDS} times)")
    sources: Counter[str] = Counter()
    load: Counter[PeerID] = Counter()

    async def fetch_unit(unit: str) -> dict:
        offers = sorted(holders[unit], key=lambda offer: load[offer[0]])  # spread units over holders
        load[offers[0][0]] += offers[0][2]
        unreachable = []
        for peer, digest, size in offers:
            if size > unit_byte_limit(model, unit):
                logger.warning(f"{peer} offers {size} bytes for {unit}, more than it can be; skipped")
                continue
            try:
                blob = await _download(p2p, peer, step=step, unit=unit, digest=digest, size=size,
                                       namespace=namespace, timeout_s=timeout_s)
            except _DownloadFailed as e:
                if e.unreachable:
                    unreachable.append(peer)
                why = e.why
            else:
                if hashlib.sha256(blob).hexdigest() == digest:
                    sources[peer.to_base58()] += len(blob)
                    return decode_tensors(blob)
                why = "bad digest"
            logger.warning(f"{unit} of step {step} from {peer}: {why}; trying the next holder")
        # only a holder we could not dial is reported unreachable: one that answered with the wrong bytes is up, and
        # the coordinator leaves out whoever reports a peer that answers its ping (coordinator/reports.py)
        raise StateUnavailable(f"every holder of {unit} for step {step} failed", peers=unreachable,
                               cause=offers[0][0])

    parts = await asyncio.gather(*(fetch_unit(unit) for unit in units))
    tensors = {name: tensor for part in parts for name, tensor in part.items()}
    report = HandoffReport(step=step, bytes=sum(sources.values()), seconds=time.perf_counter() - started,
                           sources=dict(sources))
    return StageState(step, tensors), report


async def _holders(p2p: P2P, candidates: Sequence[PeerID], *, step: int, units: Sequence[str], namespace: str,
                   timeout_s: float, roots: Sequence[CheckpointRoot], n_layers: int
                   ) -> dict[str, list[tuple[PeerID, str, int]]]:
    """For each unit some candidate holds: the holders of the digest the `roots` prove for it (module docstring),
    or, with no roots, of its most reported digest (stage_state.majority_digest)."""
    ranges = [((r.layers[0], r.layers[1]), r.root) for r in roots
              if set(units_of_layers((r.layers[0], r.layers[1]), n_layers)) & set(units)]
    asked = list(dict.fromkeys([*units, *(unit for layers, _ in ranges for unit in units_of_layers(layers, n_layers))]))
    infos = await asyncio.gather(*(_info(p2p, peer, step, asked, namespace, timeout_s) for peer in candidates))
    proven = _proven(ranges, infos, n_layers) if roots else None
    holders = {}
    for unit in units:
        offers = [(peer, info[unit]) for peer, info in zip(candidates, infos) if unit in info]
        if not offers:
            continue
        if proven is None:
            chosen = majority_digest({peer.to_base58(): digest for peer, (digest, _size) in offers},
                                     salt=f"{namespace}/step {step}/{unit}")
        elif (chosen := proven.get(unit)) is not None:
            for peer, (digest, _size) in offers:
                if digest != chosen:
                    logger.warning(f"{peer} offers {unit} of step {step} with digest {digest[:12]}, not the one the "
                                   f"checkpoint its saver wrote proves; not taken from it")
        holders[unit] = sorted(((peer, digest, size) for peer, (digest, size) in offers if digest == chosen),
                               key=lambda offer: offer[0].to_base58())
    return {unit: offers for unit, offers in holders.items() if offers}


def _proven(ranges: Sequence[tuple[tuple[int, int], str]], infos: Sequence[dict[str, tuple[str, int]]],
            n_layers: int) -> dict[str, str]:
    """Each unit's digest in a checkpoint of `ranges` whose root some candidate's digests of its units match."""
    proven: dict[str, str] = {}
    for layers, root in ranges:
        range_units = units_of_layers(layers, n_layers)
        for info in infos:
            digests = {unit: info[unit][0] for unit in range_units if unit in info}
            if len(digests) == len(range_units) and units_root(digests) == root:
                proven.update(digests)
                break
    return proven


@dataclass(frozen=True, slots=True)
class Agreement:
    """What `agree_on_step` found."""

    step: int | None
    """The newest step every source that answered holds; None when none holds any state."""
    gone: tuple[PeerID, ...] = ()
    """Sources that could not be dialled: left out at once, and worth reporting, since the plan counts on them."""


async def agree_on_step(p2p: P2P, sources: Sequence[PeerID], *, store: StateStore, version: int, namespace: str,
                        timeout_s: float, poll_s: float = 0.5) -> Agreement:
    """The step a hand-off plan starts at: the newest step every source holds (module docstring), once each source
    has switched to ``version`` or later (its states are then final); sources that never answer within
    ``timeout_s`` are left out, and so, at once, are those that cannot be dialled (they are gone). When this peer is
    a source, its own ``store`` answers for it.

    Every member of the plan asks the same sources and gets the same answers, so all start at the same step. The
    coordinator's ``Assignment.step`` is only a lower bound: the members of a plan it replaces may have trained on
    while the new plan was being published.
    """
    pending = [peer for peer in dict.fromkeys(sources) if peer != p2p.peer_id]
    newest: dict[PeerID, int | None] = {p2p.peer_id: store.newest_step} if p2p.peer_id in sources else {}
    gone: list[PeerID] = []
    asking: dict[PeerID, asyncio.Task] = {}  # at most one call per source, never cancelled (plan_session.py, _watch_peers)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while pending and asyncio.get_running_loop().time() < deadline:
        for peer in pending:
            call = asking.get(peer)
            answer = call.result() if call is not None and call.done() else None
            if answer is _GONE:
                gone.append(peer)
            elif answer is not None and answer[0] >= version:
                newest[peer] = answer[1]
            elif call is None or call.done():
                asking[peer] = asyncio.create_task(_newest(p2p, peer, namespace))
        pending = [peer for peer in pending if peer not in newest and peer not in gone]
        if pending:
            await asyncio.sleep(poll_s)
    if gone:
        logger.warning(f"{len(gone)} state source(s) cannot be dialled: {', '.join(map(str, gone))}")
    if pending:
        logger.warning(f"{len(pending)} state source(s) did not say which step they hold: "
                       f"{', '.join(str(peer) for peer in pending)}")
    steps = [step for step in newest.values() if step is not None]
    return Agreement(min(steps) if steps else None, tuple(gone))


FETCH_TRIES = 5
"""Downloads of the whole model `fetch_model` tries while the swarm trains on past the step it asked for."""


async def fetch_model(p2p: P2P, plan: Assignment, *, namespace: str, timeout_s: float) -> StageState:
    """The whole model of a running plan (`hetswarm export` from a live swarm): the newest step every member holds,
    every unit from the members that hold it, each checked against the digest most of them report. Members keep
    their last two states only, so a swarm that trains on may have moved past that step before the download; the
    step is then agreed again, up to FETCH_TRIES times (a demo run saw a busy machine's download miss its step).

    Raises:
        StateUnavailable: no member holds a state, or some unit's every holder failed at a step nobody moved past.
    """
    members = [PeerID.from_base58(peer) for peer in plan.roles]
    model = plan.model_config()
    units = units_of_layers((0, model.n_layers), model.n_layers)
    tried: int | None = None
    for _ in range(FETCH_TRIES):
        agreed = await agree_on_step(p2p, members, store=StateStore(), version=plan.version, namespace=namespace,
                                     timeout_s=timeout_s)
        if agreed.step is None:
            raise StateUnavailable(f"no member of plan v{plan.version} holds a state yet (has it trained a step?)")
        if tried is not None and agreed.step <= tried:
            break  # nobody moved on: the units are missing for another reason
        try:
            state, _ = await fetch_state(p2p, members, step=agreed.step, units=units, model=model,
                                         namespace=namespace, timeout_s=timeout_s)
            return state
        except StateUnavailable as e:
            tried, failure = agreed.step, e
            logger.info(f"The members moved past step {agreed.step} during the download; asking again")
    raise failure


async def download_model(dht: DHT, swarm: str, plan: Assignment, *, timeout_s: float) -> StageState:
    """`fetch_model` through a P2P client of `dht`'s daemon: for a process that holds no stage (export, the demo's
    sample, the coordinator's periodic export)."""
    p2p = await dht.replicate_p2p()
    try:
        return await fetch_model(p2p, plan, namespace=state_namespace(swarm), timeout_s=timeout_s)
    finally:
        await p2p.shutdown()


_GONE = object()
"""`_newest`'s answer for a source that cannot be dialled."""


async def _newest(p2p: P2P, peer: PeerID, namespace: str) -> tuple[int, int | None] | object | None:
    stub = StateServer.get_stub(p2p, peer, namespace=namespace)
    try:
        response = await stub.rpc_state_newest(runtime_pb2.ExpertRequest())
        answer = read_message(NewestState, response.metadata)
        return answer.version, answer.newest
    except Exception as e:
        logger.debug(f"No newest step from {peer}: {e!r}")
        return _GONE if dial_failed(e) else None


async def _info(p2p: P2P, peer: PeerID, step: int, units: Sequence[str], namespace: str, timeout_s: float
                ) -> dict[str, tuple[str, int]]:
    stub = StateServer.get_stub(p2p, peer, namespace=namespace)
    request = runtime_pb2.ExpertRequest(metadata=encode_message(StateInfoRequest(step=step, units=list(units))))
    try:
        response = await stub.rpc_state_info(request, timeout=timeout_s)
        if not response.metadata:  # refused, or busy
            return {}
        return {unit: (held.digest, held.size) for unit, held in read_message(StateInfo, response.metadata).held.items()}
    except Exception as e:  # a dead or hostile candidate offers nothing
        logger.debug(f"No state info from {peer}: {e!r}")
        return {}


async def _download(p2p: P2P, peer: PeerID, *, step: int, unit: str, digest: str, size: int, namespace: str,
                    timeout_s: float) -> bytes:
    """`unit`'s encoding from `peer`, at most `size` bytes; _DownloadFailed when the peer failed. A stream that ends
    short is asked for the rest while each answer brings more (a streamed answer can be cut off once its request has
    been read: docs/hivemind.md, pitfall 13); what comes is checked against `digest` by the caller."""
    stub = StateServer.get_stub(p2p, peer, namespace=namespace)
    received = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            while len(received) < size:
                asked = UnitRequest(step=step, unit=unit, digest=digest, offset=len(received))
                before = len(received)
                async for part in await stub.rpc_state_unit(runtime_pb2.ExpertRequest(metadata=encode_message(asked))):
                    received += part.metadata
                    if len(received) > size:
                        raise _DownloadFailed(f"more than the {size} bytes it announced")
                if len(received) == before:  # refused, or nothing more: the caller tries the next holder
                    raise _DownloadFailed(f"sent {len(received)} of the {size} bytes it announced, then no more")
                if len(received) < size:
                    logger.debug(f"{peer} sent {len(received)} of the {size} bytes of {unit}; asking for the rest")
    except _DownloadFailed:
        raise
    except Exception as e:
        logger.debug(f"Download of {unit} from {peer} failed: {e!r}")
        raise _DownloadFailed(f"no answer ({type(e).__name__})", unreachable=dial_failed(e)) from None
    return bytes(received)
