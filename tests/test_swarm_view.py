"""The swarm view: peer records in, symmetric matrices out, unmeasured links estimated and flagged."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hetswarm.coordinator.link_estimate import UNVALIDATED_ERROR
from hetswarm.coordinator.swarm_view import DEFAULT_LATENCY_MS, build_view
from hetswarm.protocol.network import load_hardware, load_network
from tests.helpers.swarm_records import IDS, link, record


def test_measured_links_are_symmetric_averaged_and_in_gbits():
    a, b, c = IDS[:3]
    view = build_view({a: record(a, links={b: link(10, 100)}), b: record(b, links={a: link(20, 300), c: link(5, 50)}),
                       c: record(c)})
    assert view.peer_ids == (a, b, c)
    assert view.network.latency_ms[0, 1] == view.network.latency_ms[1, 0] == 15
    assert view.network.bandwidth_gbps[0, 1] == pytest.approx(0.2)
    assert view.network.bandwidth_gbps[1, 2] == pytest.approx(0.05)
    assert (0, 1) not in view.estimated and (1, 2) not in view.estimated


def test_a_pair_of_measured_peers_takes_the_models_estimate_priced_by_the_unknown_error():
    a, b, c, d = IDS[:4]
    records = {a: record(a, site="Oregon", links={c: link(100, 40)}), b: record(b, site="Oregon"),
               c: record(c, site="Tokyo"), d: record(d, site="Tokyo", links={b: link(120, 60)})}
    view = build_view(records)
    assert set(view.estimated.values()) == {"model"} and len(view.estimated) == 4
    assert view.estimate_error is None  # two measured links: nothing to hold out
    index = {peer: view.peer_ids.index(peer) for peer in records}
    # Bandwidth: the narrowest of a's best (40), d's best (60) and the Oregon–Tokyo path's best (60), priced down.
    assert view.network.bandwidth_gbps[index[a], index[d]] * 1000 == pytest.approx(40 / (1 + UNVALIDATED_ERROR))
    # Within Oregon no path was measured: only the access links bound it.
    assert view.network.bandwidth_gbps[index[a], index[b]] * 1000 == pytest.approx(40 / (1 + UNVALIDATED_ERROR))
    assert (view.network.latency_ms[~np.eye(4, dtype=bool)] > 0).all()


def test_a_pair_with_one_unmeasured_peer_takes_the_other_peers_medians():
    a, b, c, d = IDS[:4]
    view = build_view({a: record(a, links={b: link(10, 100), c: link(50, 20)}), b: record(b), c: record(c),
                       d: record(d)})
    assert view.estimated == {(1, 2): "model", (0, 3): "peers", (1, 3): "peers", (2, 3): "peers"}
    assert view.network.latency_ms[0, 3] == 30 and view.network.bandwidth_gbps[0, 3] == pytest.approx(0.06)
    assert view.network.latency_ms[1, 3] == 10 and view.network.bandwidth_gbps[1, 3] == pytest.approx(0.1)


def test_a_pair_of_unmeasured_peers_gets_the_swarm_median_and_nothing_is_zero_or_infinite():
    a, b, c, d = IDS[:4]
    view = build_view({a: record(a, links={b: link(10, 100)}), b: record(b), c: record(c), d: record(d)})
    assert view.estimated[(2, 3)] == "swarm" and view.estimated[(0, 2)] == "peers"
    off_diagonal = ~np.eye(4, dtype=bool)
    assert (view.network.latency_ms[off_diagonal] > 0).all()
    assert np.isfinite(view.network.bandwidth_gbps[off_diagonal]).all()


def test_nothing_measured_falls_back_to_flagged_defaults():
    a, b = IDS[:2]
    view = build_view({a: record(a), b: record(b)})
    assert view.estimated == {(0, 1): "default"}
    assert view.network.latency_ms[0, 1] == DEFAULT_LATENCY_MS


def test_only_peers_that_can_train_are_in_view():
    a, b, c, d = IDS[:4]
    view = build_view({a: record(a), b: record(b, state="joining"), c: record(c, state="leaving"),
                       d: record(d, tflops=0.0)})
    assert view.peer_ids == (a,)


def test_saved_view_is_a_scenario_the_scheduler_loads(tmp_path):
    a, b, c = IDS[:3]
    view = build_view({a: record(a, site="X", links={b: link(10, 100)}), b: record(b, site="Y"), c: record(c, site="X")})
    path = tmp_path / "view.json"
    path.write_text(json.dumps(view.to_dict()))
    network = load_network(str(path))
    assert np.array_equal(network.latency_ms, view.network.latency_ms)
    assert np.array_equal(network.bandwidth_gbps, view.network.bandwidth_gbps)
    assert network.sites == ("X", "Y", "X")
    tflops, memory = load_hardware(path)
    assert tflops.tolist() == [1.0] * 3 and memory.tolist() == [4.0] * 3
    assert json.loads(path.read_text())["estimated_links"][0]["method"] in ("model", "peers")
