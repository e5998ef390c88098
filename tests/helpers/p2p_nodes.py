"""Real p2p daemons in the test's own process, for servicer tests that need no DHT (as hivemind's p2p tests do)."""
import contextlib
from collections.abc import AsyncIterator

from hivemind.p2p import P2P


@contextlib.asynccontextmanager
async def connected_p2ps(n: int) -> AsyncIterator[list[P2P]]:
    """``n`` daemons on 127.0.0.1, each bootstrapped from the first; all shut down on exit."""
    first = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    peers = [first]
    try:
        maddrs = await first.get_visible_maddrs()
        for _ in range(n - 1):
            peers.append(await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs))
        yield peers
    finally:
        for p2p in peers:
            await p2p.shutdown()
