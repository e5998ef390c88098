"""Which end measures each link the coordinator asks for (coordinator/measurement_wait.py: `balanced`), against
every orientation of small random sets of links."""
from __future__ import annotations

import itertools
import random
from collections import Counter

from hetswarm.coordinator.measurement_wait import balanced


def most_measured(oriented) -> int:
    return max(Counter(measurer for measurer, _ in oriented).values(), default=0)


def fewest_possible(pairs) -> int:
    """The oracle: the least, over every choice of measurers, of the most links one peer measures."""
    return min(most_measured([(a, b) if flip else (b, a) for (a, b), flip in zip(pairs, flips)])
               for flips in itertools.product((False, True), repeat=len(pairs)))


def test_the_busiest_measurer_has_as_few_links_as_any_choice_of_measurers_allows():
    rng = random.Random(0)
    for _ in range(300):
        peers = [f"peer{i}" for i in range(rng.randint(2, 7))]
        links = list(itertools.combinations(peers, 2))
        pairs = rng.sample(links, rng.randint(1, min(10, len(links))))
        oriented = balanced(pairs)
        assert sorted(tuple(sorted(pair)) for pair in oriented) == sorted(pairs)  # each link once, either way round
        assert most_measured(oriented) == fewest_possible(pairs)


def test_a_peer_in_many_asked_links_leaves_them_to_its_partners():
    """A plan's hub (a stage's peer in every group and hop) next to peers with one link each: the smaller id, the
    rule for the other links, could leave it all of them in a row."""
    hub, partners = "a", [f"b{i}" for i in range(8)]
    oriented = balanced([(hub, partner) for partner in partners])
    assert most_measured(oriented) == 1  # the hub measures one at most, as each of its partners
