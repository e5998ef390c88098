"""A peer of the swarm: its DHT node (a forked process with its own p2pd) and its P2P replica for streams."""
from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import hivemind
import psutil
from hivemind.p2p import P2P, PeerID
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.addresses import ANY_HOST, check_maddrs
from hetswarm.client.peer.emulation import EmulatedP2P, LinkShaper, SiteLinks
from hetswarm.client.peer.hivemind_compat import (
    bound_stream_messages,
    load_identity,
    patient_identity_check,
    read_commands_whole,
    settle_late_answers,
    shut_down_from_inside,
)
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import check_swarm_name
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.signing import make_validators

logger = logging.getLogger(__name__)

DEFAULT_SWARM = "hetswarm"
DHT_START_TIMEOUT_S = 120.0
"""For the DHT process to come up: its identity check's daemon and its own (P2PD_START_TIMEOUT_S each), then joining
through the initial peers; one of 64 peers on 2 cores took longer than 60 s."""
P2PD_START_TIMEOUT_S = 45.0
"""hivemind gives a p2p daemon 15 s to start. On a busy machine that is too little: of 64 peers started at once on 2
cores (benchmarks/swarm_scale.py), 25 gave up with "Daemon failed to start in 15.0 seconds". Given to the peer's
daemon and to the one that checks its identity is free first (client/peer/hivemind_compat/identity.py); within the
DHT's own DHT_START_TIMEOUT_S, which also covers joining through the initial peers."""
BOOTSTRAP_ATTEMPTS = 3
"""Starts of the DHT node when none of the initial peers answered its first ping: hivemind waits 3 s for an answer
and gives up, and a busy initial peer can take longer (1 of 64 peers joining a 2-core machine, load average 130,
died so: benchmarks/swarm_scale.py)."""
BOOTSTRAP_PAUSE_S = 5.0
"""Between those starts."""
UNANSWERED_BOOTSTRAP = "none of the initial_peers responded"
"""What hivemind's DHTNode.create says when no initial peer answered."""
SITE_REFRESH_S = 1.0
PARENT_POLL_S = 0.5
"""How often the DHT process checks that the process that started it still lives."""
ORPHAN_GRACE_S = 3.0
"""How long an orphaned DHT process may take to shut down cleanly before it kills p2pd and exits anyway."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeConfig:
    """How a peer joins: where it listens, whom it knows, who it is."""

    swarm: str = DEFAULT_SWARM
    initial_peers: tuple[str, ...] = ()
    host_maddrs: tuple[str, ...] = (ANY_HOST,)
    announce_maddrs: tuple[str, ...] = ()
    identity_path: Path | None = None
    """libp2p identity (RSA), created if missing; None for a throw-away identity."""
    client_mode: bool = False
    """Accept no inbound connections (monitors, peers behind NAT)."""

    def __post_init__(self) -> None:
        check_swarm_name(self.swarm)
        object.__setattr__(self, "initial_peers", tuple(check_maddrs(self.initial_peers, option="--initial-peers", need_peer_id=True)))
        object.__setattr__(self, "host_maddrs", tuple(check_maddrs(self.host_maddrs, option="--host-maddrs")))
        object.__setattr__(self, "announce_maddrs", tuple(check_maddrs(self.announce_maddrs, option="--announce-maddrs")))


class OwnedDHT(hivemind.DHT):
    """A hivemind DHT process that dies with the process that started it, taking its p2pd along.

    hivemind's DHT process outlives a SIGKILLed parent and keeps serving the swarm, with its p2pd, until someone
    kills it (docs/hivemind.md, pitfall 5); torch's shm manager, which the DHT process also keeps open, stays too.
    Here a thread of the DHT process polls its parent pid: once the parent is gone, the process asks itself to shut
    down the way `shutdown()` does (p2pd is terminated and awaited), and after `ORPHAN_GRACE_S` kills p2pd by PID
    and exits regardless. (p2pd was seen to end within 50 ms of the DHT process anyway, on EOF of its control
    connection, or of SIGPIPE when it logs that to its closed stdout; it is ended by PID all the same.) Polling,
    unlike prctl(PR_SET_PDEATHSIG), also works off Linux and is not fooled when the thread that forked the DHT
    exits before its process does.
    """

    def __init__(self, *args, parent_poll_s: float = PARENT_POLL_S, **kwargs):
        if parent_poll_s <= 0:
            raise ValueError(f"parent_poll_s must be positive, got {parent_poll_s}")
        self._owner_pid = os.getpid()  # the process that forks us: multiprocessing starts only from the creator
        self._parent_poll_s = parent_poll_s
        super().__init__(*args, **kwargs)

    def run(self) -> None:
        """In the DHT process: hivemind's serving loop, plus the thread that ends it when our parent dies."""
        threading.Thread(target=self._end_when_orphaned, name="hetswarm-parent-watch", daemon=True).start()
        read_commands_whole(self)
        try:
            super().run()
        finally:  # normally p2pd is already gone (awaited in shutdown); not when the node failed half-way
            end_processes(psutil.Process().children(recursive=True))

    def _end_when_orphaned(self) -> None:
        """Waits for the parent to die (we are re-parented), then shuts down cleanly or, failing that, hard."""
        while os.getppid() == self._owner_pid:
            time.sleep(self._parent_poll_s)
        logger.warning(f"The process that started this DHT node ({self._owner_pid}) is gone; shutting down")
        try:
            shut_down_from_inside(self)  # the clean path
        except (OSError, ValueError):
            pass
        time.sleep(ORPHAN_GRACE_S)  # a clean shutdown ends this process, and this daemon thread with it
        end_processes(psutil.Process().children(recursive=True))
        os._exit(1)

    def shutdown(self) -> None:
        """hivemind's shutdown; if that had to terminate the DHT process, its p2pd is then ended by PID too."""
        daemons = _children_of(self.pid) if self.pid is not None and self.is_alive() else []
        super().shutdown()
        end_processes(daemons)


def _children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def end_processes(processes: list[psutil.Process], grace_s: float = 1.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`, to those of `processes` still running (psutil checks the start
    time, so a recycled PID is never signalled)."""
    running = []
    for process in processes:
        try:
            process.terminate()
            running.append(process)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(running, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def start_dht(config: NodeConfig, identity: Identity) -> hivemind.DHT:
    """Starts the DHT process; call before any thread, CUDA or heavy torch work (it forks: docs/hivemind.md).

    The process (and its p2pd) ends when ours does, even when ours is SIGKILLed (OwnedDHT). Both processes' p2pd
    clients, and every one this process makes later, leave an answer to a cancelled call alone
    (client/peer/hivemind_compat/control.py). A node none of whose initial peers answered its first ping in time
    is started again, up to BOOTSTRAP_ATTEMPTS times.

    The node caches nothing on other nodes (`cache_nearest=0`): hivemind's default sends what every read found, all
    of the records under the key merged (175 KB at 64 peers), to one more node after each read, which checks every
    record of it again; the records' owners store them on 5 nodes themselves, every T/2."""
    settle_late_answers()
    patient_identity_check(P2PD_START_TIMEOUT_S)
    attempt = 1
    while True:
        dht = OwnedDHT(
            initial_peers=list(config.initial_peers),
            host_maddrs=list(config.host_maddrs),
            announce_maddrs=list(config.announce_maddrs) or None,
            identity_path=str(identity.path),
            client_mode=config.client_mode,
            record_validators=make_validators(config.swarm, identity.private_key),
            startup_timeout=P2PD_START_TIMEOUT_S,
            cache_nearest=0,
            start=False,
        )
        try:
            dht.run_in_background(await_ready=True, timeout=DHT_START_TIMEOUT_S)
            return dht
        except Exception as e:
            dht.shutdown()
            if attempt == BOOTSTRAP_ATTEMPTS or UNANSWERED_BOOTSTRAP not in str(e):
                raise HetswarmError(f"could not start the DHT node ({type(e).__name__}: {e}); check --initial-peers "
                                    f"and that those peers are up") from None
        logger.warning(f"None of the initial peers answered our DHT node's ping in time; trying again in "
                       f"{BOOTSTRAP_PAUSE_S:.0f} s ({attempt} of {BOOTSTRAP_ATTEMPTS} tries)")
        time.sleep(BOOTSTRAP_PAUSE_S)
        attempt += 1


def start_dht_for_process(config: NodeConfig, identity: Identity) -> hivemind.DHT:
    """The DHT of a CLI process: Ctrl+C reaches us, not the DHT, which we shut down ourselves.

    A Ctrl+C while the DHT process forks is held back and delivered once it is up: the child must not die of it
    (hivemind's DHT process ignores SIGINT from its first step, and its p2pd inherits that), and we must not lose
    it (ignoring it here made an interrupted demo run on to the end). If it stops us, the new DHT is shut down.
    """
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        dht = start_dht(config, identity)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        try:
            signal.raise_signal(signal.SIGINT)
        except BaseException:
            dht.shutdown()
            raise
    return dht


@dataclass(frozen=True)
class Identity:
    """The RSA key that is both the libp2p identity (peer id) and the record-signing key."""

    path: Path
    private_key: RSAPrivateKey

    @property
    def peer_id(self) -> str:
        return peer_id_of(self.private_key.get_public_key())


def identity_for(config: NodeConfig) -> Identity:
    """The configured identity, or a throw-away one for this run (removed at exit)."""
    path = config.identity_path
    if path is None:
        folder = tempfile.mkdtemp(prefix="hetswarm-identity-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = Path(folder) / "identity.key"
    return Identity(path, load_identity(path))


@dataclass
class SwarmNode:
    """A started peer; `p2p` shares the DHT's peer id, and is emulated when the client emulates its links."""

    config: NodeConfig
    dht: hivemind.DHT
    identity: Identity
    p2p: P2P | EmulatedP2P
    sites: dict[str, str] = field(default_factory=dict)
    """Peer id → emulated site, from the peers' records; the link shaper reads it."""
    _looked_up_at: dict[str, float] = field(default_factory=dict)
    _sites_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def site_of(self, peer: PeerID) -> str | None:
        """A peer's emulated site; a peer not seen yet makes us read the records (at most once a second per peer)."""
        peer_id = peer.to_base58()
        if peer_id in self.sites:
            return self.sites[peer_id]  # known peers never wait behind another peer's lookup
        async with self._sites_lock:
            now = time.monotonic()
            if peer_id not in self.sites and now - self._looked_up_at.get(peer_id, -SITE_REFRESH_S) >= SITE_REFRESH_S:
                self._looked_up_at[peer_id] = now
                try:
                    records = await self.records.peers()
                except TimeoutError:
                    return None  # the next message to this peer looks again
                self.sites.update({p: r.site for p, r in records.items() if r.site is not None})
        return self.sites.get(peer_id)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @functools.cached_property
    def records(self) -> SwarmRecords:
        """The swarm's records, read and signed by this peer, every call under a deadline."""
        return SwarmRecords(self.dht, self.config.swarm, private_key=self.private_key)

    @property
    def private_key(self) -> RSAPrivateKey:
        return self.identity.private_key

    @property
    def initial_peers_line(self) -> str:
        return initial_peers_line(self.dht)

    @classmethod
    async def attach(cls, config: NodeConfig, dht: hivemind.DHT, identity: Identity, *,
                     site_links: SiteLinks | None = None, site: str | None = None) -> SwarmNode:
        """Replicates the DHT's P2P into this event loop, wrapped in link emulation when asked; every stream message
        this process reads is bounded from then on (client/peer/hivemind_compat/streams.py)."""
        bound_stream_messages()
        p2p = await dht.replicate_p2p()
        node = cls(config, dht, identity, p2p)
        if site_links is not None:
            if site is None:
                raise HetswarmError("--emulate needs --site: the scenario site this peer pretends to be at")
            shaper = LinkShaper(site_links, site, node.site_of)
            node.p2p = EmulatedP2P(p2p, shaper)
        return node


def initial_peers_line(dht: hivemind.DHT) -> str:
    """The ready-to-paste options that let another peer join through this one."""
    return " ".join(f"--initial-peers {m}" for m in dht.get_visible_maddrs())
