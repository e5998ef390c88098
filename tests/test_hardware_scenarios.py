"""Scenarios with mixed GPUs (protocol/network.py): each borrows a paper network's links device for device and
gives every device a GPU with its datasheet figures, cited in the file; the scheduler's loaders read them by name."""
import json

import numpy as np
import pytest

from hetswarm.protocol.network import (
    HARDWARE_SCENARIOS,
    PAPER_SCENARIOS,
    InvalidNetwork,
    load_hardware,
    load_network,
    load_scenario,
)


@pytest.mark.parametrize("name", list(HARDWARE_SCENARIOS))
def test_a_hardware_scenario_has_its_networks_links_and_a_cited_gpu_on_every_device(name):
    data, label = load_scenario(name)
    base = load_network(data["network"])
    network = load_network(name)
    assert label == name and data["network"] in PAPER_SCENARIOS
    np.testing.assert_array_equal(network.latency_ms, base.latency_ms)
    np.testing.assert_array_equal(network.bandwidth_gbps, base.bandwidth_gbps)
    assert network.sites == base.sites
    gpus = {device["gpu"] for device in data["devices"]}
    assert gpus <= set(data["sources"]) and all("datasheet" in data["sources"][gpu] or "whitepaper" in
                                                data["sources"][gpu] for gpu in gpus)
    tflops, memory_gib = load_hardware(name)
    assert len(tflops) == len(memory_gib) == network.n_devices == 64
    assert (tflops > 0).all() and (memory_gib > 0).all() and len(gpus) >= 2


def test_the_mixed_data_center_has_half_its_devices_about_eight_times_slower():
    tflops, _ = load_hardware("mixed-datacenter")
    assert sorted(np.unique(tflops)) == [125.0, 989.5] and (tflops == 125.0).sum() == 32


def test_the_paper_scenarios_carry_no_hardware_and_keep_their_case_numbers():
    assert load_hardware("worldwide") is None
    assert load_network("case5").name == "worldwide"
    with pytest.raises(InvalidNetwork, match="unknown scenario 'case6'"):
        load_network("case6")


def test_a_scenario_whose_devices_are_not_its_networks_is_refused(tmp_path):
    data, _ = load_scenario("mixed-datacenter")
    data = {key: value for key, value in data.items() if not key.endswith("_matrix")}
    data["devices"] = data["devices"][:-1]  # one device short of case 1's 64
    path = tmp_path / "short.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidNetwork, match="devices are not those of its network 'datacenter'"):
        load_network(str(path))
