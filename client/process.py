"""What every long-running hetswarm process shares: signal handling that leaves cleanly, and DHT start-up."""
from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator

import hivemind
from hetswarm.client.node import Identity, NodeConfig, start_dht


@contextlib.contextmanager
def _ignoring_sigint() -> Iterator[None]:
    """Children forked meanwhile (the DHT process and its p2pd) ignore Ctrl+C, so we can say goodbye first."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start_dht_for_process(config: NodeConfig, identity: Identity) -> hivemind.DHT:
    """The DHT of a CLI process: Ctrl+C reaches us, not the DHT, which we shut down ourselves."""
    with _ignoring_sigint():
        return start_dht(config, identity)


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Runs `main(stop)` in a fresh event loop; SIGINT or SIGTERM set `stop` so main can leave cleanly."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())
