"""Which links of this peer to measure, and when (client/peer/volunteer.py runs the rounds).

Each peer measures at most `max_links` links (protocol/measurement_policy.py says which: the plan's, its site's,
a rotating sample), and each pair is measured by its peer with the smaller id: half the probe traffic, and no probe's
pings wait behind the other side's payload on the same link; links count as symmetric, as the paper's model has
them. A link the coordinator asks for is measured by the end it names, whichever id is smaller. A round measures
the unmeasured peers first, then the stalest measurements, at most `max_probes_per_round`, choosing each probe
after the last (a link asked for meanwhile goes next); a measurement is taken again after `reprobe_s`, which is also
how long the sample stays the same. Within one such epoch at most `max_links` other peers are probed, also while the
view grows and the chosen links shift; the plan's partners and the links the coordinator asks for (at most half the
budget at any time) are probed besides, so that a new plan's links are measured at once, not an epoch later. A peer
whose probe failed (crashed, until its record expires; or serving no probe handler) is tried again only after an
exponential backoff, so that it never makes the prober spin. Between probes, the frames this peer sends over a link
it measures update that link (`observe`).
"""
from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from hetswarm.client.peer.link_probe import carried, measure_link
from hetswarm.client.peer.node import SwarmNode
from hetswarm.protocol.keys import probe_namespace, short_id
from hetswarm.protocol.measurement_policy import links_to_measure
from hetswarm.protocol.records import LinkMeasurement, LinkRequests, PeerRecord

if TYPE_CHECKING:
    from hetswarm.client.peer.volunteer import VolunteerConfig

__all__ = ["LinkProber"]

logger = logging.getLogger(__name__)


class LinkProber:
    """This peer's link measurements and the probes that make them (module docstring)."""

    def __init__(self, node: SwarmNode, config: VolunteerConfig,
                 partners: Callable[[], Collection[str]] = frozenset) -> None:
        """`partners`: the peers the plan in force has this one exchange with, now (their links come first)."""
        self.node, self.config, self.partners = node, config, partners
        self.asked: frozenset[str] = frozenset()
        """The peers whose link with us the coordinator asks us to measure first (protocol/records.py:
        LinkRequests); measured as the plan's partners are."""
        self.links: dict[str, LinkMeasurement] = {}
        self._failures: dict[str, int] = {}
        """Failed probes in a row, per peer in view."""
        self._retry_at: dict[str, float] = {}
        """time.monotonic() before which a peer that failed its last probe is not probed again."""
        self.probe_attempts: collections.Counter[str] = collections.Counter()
        """Probes started, per peer: for logs and tests."""
        self._epoch = -1
        """The sample's epoch (protocol/measurement_policy.py) that `_probed` counts."""
        self._probed: set[str] = set()
        """The peers probed in that epoch (module docstring: at most `max_links` of them not partners), also those
        that left the view since: one that comes back within the epoch takes no second place in the budget."""

    @property
    def namespace(self) -> str:
        """Where every peer of the swarm serves its probe handler (client/peer/link_probe.py)."""
        return probe_namespace(self.node.config.swarm)

    def newest_links(self) -> dict[str, LinkMeasurement]:
        """The links this peer's record lists: the `max_links` most recently measured (a rotated-out link's
        measurement stays until newer ones push it out)."""
        newest = sorted(self.links.items(), key=lambda item: item[1].measured_at, reverse=True)
        return dict(newest[:self.config.max_links])

    def observe(self, peer: str, n_bytes: int, seconds: float) -> None:
        """A message of the plan's traffic (a frame) went to `peer`: a link this peer measures takes what it showed
        (client/peer/link_probe.py, `carried`); the other end measures the others, and an unmeasured link has no
        RTT to take off yet."""
        if peer in self.links:
            self.links[peer] = carried(self.links[peer], n_bytes, seconds)

    def ask(self, requests: LinkRequests | None) -> bool:
        """Takes the coordinator's current requests; whether they changed what we are asked for."""
        asked = requests.targets_of(self.node.peer_id) if requests is not None else frozenset()
        changed, self.asked = asked != self.asked, asked
        return changed

    def wait_s(self, peers: Mapping[str, PeerRecord]) -> float:
        """Seconds until one of the links to `peers` that this peer measures is due (`reprobe_s` if none)."""
        return min((self._wait_before_probe(p) for p in self._mine(peers)), default=self.config.reprobe_s)

    async def round(self, peers: Mapping[str, PeerRecord]) -> bool:
        """Probes the due links to `peers` (the records in view), one at a time, choosing each after the last, so
        that a link the coordinator asks for while a round runs is measured next, not after the round (a probe
        takes seconds; the coordinator holds its plan until the links are in). Then forgets the failures of peers
        no longer in view, and their measurements once the epoch that took them is over (a peer back within it is
        not probed again). A round that measured a link the coordinator asked for, or a plan's partner, ends
        there, so that the caller publishes it at once. Returns whether a link was measured anew."""
        measured = False
        for _ in range(self.config.max_probes_per_round):
            if (peer := self._next_due(peers)) is None:
                break
            if await self._probe_one(peer):
                measured = True
                if peer in self._waited_for():
                    break  # the record carries it now, not after up to 7 more probes
        in_view = set(peers)
        self.links = {p: m for p, m in self.links.items() if p in in_view or p in self._probed}
        self._failures = {p: n for p, n in self._failures.items() if p in in_view}
        self._retry_at = {p: t for p, t in self._retry_at.items() if p in in_view}
        return measured

    def _next_due(self, peers: Mapping[str, PeerRecord]) -> str | None:
        """The due link to probe first: an unmeasured one before a stale one, and among those the plan's partners
        and the links asked for first (`_mine`); then the stalest."""
        due = [p for p in self._mine(peers) if self._wait_before_probe(p) == 0.0]
        return min(due, key=lambda p: self.links[p].measured_at if p in self.links else -1.0, default=None)

    def _mine(self, peers: Mapping[str, PeerRecord]) -> list[str]:
        """The peers whose link to us we measure: those of the chosen links with a larger id, and those the
        coordinator asks us for (module docstring)."""
        me, epoch = self.node.peer_id, int(get_dht_time() // self.config.reprobe_s)
        if epoch != self._epoch:
            self._epoch, self._probed = epoch, set()
        partners = self._waited_for()
        chosen = links_to_measure(me, peers, site=self.config.site, partners=partners,
                                  budget=self.config.max_links, epoch=epoch)
        mine = [p for p in chosen if p > me or p in self.asked]
        first = [p for p in mine if p in partners or p in self._probed]
        room = max(self.config.max_links - len(self._probed - partners), 0)
        return first + [p for p in mine if p not in first][:room]

    def _waited_for(self) -> frozenset[str]:
        """The peers whose links are waited for: those the coordinator asks for and the plan's partners."""
        return self.asked | frozenset(self.partners())

    def _wait_before_probe(self, peer: str) -> float:
        """Seconds until `peer` is due: its measurement goes stale, or its backoff after a failure runs out."""
        stale_in = self.links[peer].measured_at + self.config.reprobe_s - get_dht_time() if peer in self.links else 0.0
        backoff_in = self._retry_at.get(peer, 0.0) - time.monotonic()
        return max(stale_in, backoff_in, 0.0)

    def _backoff_s(self, failures: int) -> float:
        return min(self.config.probe_backoff_s * 2 ** min(failures - 1, 32), self.config.probe_backoff_max_s)

    async def _probe_one(self, peer: str) -> bool:
        """One probe of one peer: True with a new measurement; a failure sets the peer's next try (backoff)."""
        self.probe_attempts[peer] += 1
        self._probed.add(peer)
        try:
            link = await measure_link(self.node.p2p, PeerID.from_base58(peer), namespace=self.namespace,
                                      config=self.config.probe)
        except Exception as e:  # a dead or misbehaving peer costs one probe per backoff, never the client
            failures = self._failures[peer] = self._failures.get(peer, 0) + 1
            wait_s = self._backoff_s(failures)
            self._retry_at[peer] = time.monotonic() + wait_s
            logger.debug(f"Probe of {short_id(peer)} failed ({failures} in a row), next try in {wait_s:.0f} s: {e!r}",
                         exc_info=True)
            return False
        self._failures.pop(peer, None)
        self._retry_at.pop(peer, None)
        self.links[peer] = link
        logger.info(f"Link to {short_id(peer)}: {link.latency_ms:.1f} ms, {link.bandwidth_mbps:.1f} Mbit/s")
        return True
