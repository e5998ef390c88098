"""`hetswarm join --emulate-tflops`: a peer publishes the slower device's figure and computes as slowly as it would,
so one machine can run a swarm of mixed GPUs (tests/test_join_swarm.py checks the published record end to end)."""
import asyncio
import time

import pytest
import torch

from hetswarm.client.peer.hardware import emulate_tflops
from hetswarm.client.training.stage_passes import StagePasses
from hetswarm.client.training.step_clock import start_clock
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.records import Hardware

MEASURED = Hardware(device="cpu", device_name="test cpu", tflops=0.2, dtype="float32", memory_gib=16.0)


def test_the_emulated_device_is_published():
    hardware = emulate_tflops(MEASURED, 0.05)
    assert hardware.tflops == 0.05 and hardware.memory_gib == MEASURED.memory_gib


@pytest.mark.parametrize("tflops", [0.2, 1.0, 0.0, -1.0])
def test_a_device_cannot_be_emulated_faster_than_it_is(tflops):
    with pytest.raises(HetswarmError, match="below this device's measured 0.2 TFLOPS"):
        emulate_tflops(MEASURED, tflops)


def computed_s(tflops: float | None, seconds: float) -> float:
    """The compute time a worker emulating `tflops` counts for 0.3 GFLOP that take `seconds` here."""
    passes = StagePasses.__new__(StagePasses)  # only what `computing` reads: the device and the speed
    passes.device, passes.emulated_tflops = torch.device("cpu"), tflops

    async def compute() -> float:
        clock = start_clock()
        assert await passes.computing(work, seconds, flops=0.3e9) == "done"
        return clock.compute_s

    return asyncio.run(compute())


def work(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@pytest.mark.timing
def test_a_computation_takes_as_long_as_its_flops_on_the_emulated_device_however_busy_this_one_is():
    assert 0.3 <= computed_s(1e-3, 0.05) < 0.3 + 0.1  # 1 GFLOPS: padded to the device's 0.3 s, not 0.05 s × some factor
    assert 0.4 <= computed_s(1e-3, 0.4) < 0.4 + 0.1  # this machine was slower still: nothing added
    assert computed_s(None, 0.05) < 0.05 + 0.1
