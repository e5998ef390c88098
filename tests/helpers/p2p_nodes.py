"""Real p2p daemons in the test's own process, for servicer tests that need no DHT (as hivemind's p2p tests do)."""
import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from hivemind.p2p import P2P
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.hivemind_compat import load_identity


@contextlib.asynccontextmanager
async def connected_p2ps(n: int, identities: Sequence[Path] = ()) -> AsyncIterator[list[P2P]]:
    """``n`` daemons on 127.0.0.1, every pair connected; all shut down on exit. Daemon i takes the identity file
    ``identities[i]`` when given (protocol/identity.py's load_identity makes one), else a fresh one.

    Bootstrapping each from the first alone leaves the others to find each other through p2pd's Kademlia table,
    which a loaded machine may not have filled when the test opens its first stream: a CI run saw the first
    all-reduce of two such daemons fail at once (tests/test_group_allreduce.py). The tests are not about routing.
    Bootstrapping connects in the background, so each daemon is also waited for until it lists every other one as
    connected (two xdist workers saw the first 8-bit round partial without that wait).
    """
    peers: list[P2P] = []
    try:
        for _ in range(n):
            earlier = [maddr for peer in peers for maddr in await peer.get_visible_maddrs()]
            identity = {"identity_path": str(identities[len(peers)])} if identities else {}
            peers.append(await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=earlier, **identity))
        async with asyncio.timeout(30):
            for p2p in peers:
                while len({info.peer_id for info in await p2p.list_peers()} & {p.peer_id for p in peers}) < n - 1:
                    await asyncio.sleep(0.05)
        yield peers
    finally:
        for p2p in peers:
            await p2p.shutdown()


@contextlib.asynccontextmanager
async def keyed_p2ps(n: int) -> AsyncIterator[list[tuple[P2P, RSAPrivateKey]]]:
    """As `connected_p2ps`, each daemon with the key of its identity (for what a peer signs)."""
    with tempfile.TemporaryDirectory(prefix="hetswarm-keys-") as folder:
        paths = [Path(folder) / f"peer{index}.key" for index in range(n)]
        keys = [load_identity(path) for path in paths]
        async with connected_p2ps(n, paths) as p2ps:
            yield list(zip(p2ps, keys))
