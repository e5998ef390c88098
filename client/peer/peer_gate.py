"""Per-peer limits on what one peer can make a handler do, and a bound on any stream message at the transport.

Anyone who can dial a peer can call its handlers: a stranger could open streams without end, or make a peer absorb
probe payloads as fast as it sends them. A `PeerGate` in front of a handler bounds, per remote peer, the streams
open at once and the calls per second (a token bucket), and may admit only some peers (those in view, say); a
refused call is answered at once, unread. The size of each stream message is bounded below the handlers, in
hivemind's stream reader (client/peer/hivemind_compat/streams.py).
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from hetswarm.protocol.errors import ConfigError

__all__ = ["PeerGate"]

logger = logging.getLogger(__name__)

WARN_EVERY_S = 30.0
"""A peer that keeps being refused is logged at most this often."""


@dataclass
class PeerGate:
    """Limits of one handler, per remote peer (module docstring)."""

    name: str
    max_concurrent: int
    per_s: float
    """Calls per second a peer may sustain, after a burst of `burst`."""
    burst: float
    admits: Callable[[str], bool] | None = None
    """Whether a peer may call at all; None admits everyone."""
    _active: Counter = field(default_factory=Counter)
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Peer → (tokens, when counted)."""
    _warned_at: dict[str, float] = field(default_factory=dict)
    refused: Counter = field(default_factory=Counter)
    """Refused calls per peer, for tests and logs."""

    def __post_init__(self) -> None:
        if self.max_concurrent < 1 or self.per_s <= 0 or self.burst < 1:
            raise ConfigError(f"gate {self.name}: need max_concurrent >= 1, per_s > 0 and burst >= 1")

    @contextlib.contextmanager
    def enter(self, peer: str) -> Iterator[str | None]:
        """Yields why `peer` is refused now, or None, holding one of its concurrent slots until the block ends."""
        reason = self._refusal(peer, time.monotonic())
        if reason is not None:
            self.refused[peer] += 1
            self._warn(peer, reason)
            yield reason
            return
        self._active[peer] += 1
        try:
            yield None
        finally:
            self._active[peer] -= 1
            if not self._active[peer]:
                del self._active[peer]

    def _refusal(self, peer: str, now: float) -> str | None:
        if self.admits is not None and not self.admits(peer):
            return "not a peer of this swarm in view"
        if self._active[peer] >= self.max_concurrent:
            return f"already {self._active[peer]} {self.name} streams open"
        tokens, then = self._buckets.get(peer, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.per_s)
        if tokens < 1:
            self._buckets[peer] = (tokens, now)
            return f"over {self.per_s:g} {self.name} calls per second"
        self._buckets[peer] = (tokens - 1, now)
        if len(self._buckets) > 4096:  # forget peers idle long enough to have a full bucket again
            full_after = self.burst / self.per_s
            self._buckets = {p: (t, w) for p, (t, w) in self._buckets.items() if now - w < full_after}
        return None

    def _warn(self, peer: str, reason: str) -> None:
        now = time.monotonic()
        if now - self._warned_at.get(peer, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned_at[peer] = now
            logger.warning(f"Refused a {self.name} call from {peer}: {reason} ({self.refused[peer]} refused so far)")
