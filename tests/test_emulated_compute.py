"""`hetswarm join --emulate-tflops`: a peer publishes the slower device's figure and computes as slowly as it would,
so one machine can run a swarm of mixed GPUs (tests/test_join_swarm.py checks the published record end to end)."""
import asyncio
import time

import pytest
import torch

from hetswarm.client.peer.hardware import emulate_tflops
from hetswarm.client.training.stage_worker import StageWorker
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.records import Hardware

MEASURED = Hardware(device="cpu", device_name="test cpu", tflops=0.2, dtype="float32", memory_gib=16.0)


def test_the_emulated_device_is_published_with_its_slowdown():
    hardware, slowdown = emulate_tflops(MEASURED, 0.05)
    assert hardware.tflops == 0.05 and hardware.memory_gib == MEASURED.memory_gib
    assert slowdown == pytest.approx(4.0)


@pytest.mark.parametrize("tflops", [0.2, 1.0, 0.0, -1.0])
def test_a_device_cannot_be_emulated_faster_than_it_is(tflops):
    with pytest.raises(HetswarmError, match="below this device's measured 0.2 TFLOPS"):
        emulate_tflops(MEASURED, tflops)


def test_every_computation_takes_slowdown_times_as_long():
    worker = StageWorker.__new__(StageWorker)  # only what _computing reads: the device, the clock, the slowdown
    worker.device, worker.compute_slowdown, worker._compute_s = torch.device("cpu"), 3.0, 0.0

    def work() -> str:
        time.sleep(0.05)
        return "done"

    assert asyncio.run(worker._computing(work)) == "done"
    assert worker._compute_s >= 3 * 0.05
