"""What a hetswarm process sets in its environment before hivemind, and with it torch, is first imported.

hivemind 1.1.12 sets torch's tensor-sharing strategy when it is imported (hivemind/utils/mpfuture.py), to
"file_system" unless HIVEMIND_MEMORY_SHARING_STRATEGY names another. Every call to a DHT creates an MPFuture whose
state is a byte of shared memory, and under "file_system" every process that shares one starts a
`torch_shm_manager` of its own: 57 MB PSS for each peer (benchmarks/RESULTS.md, "A standing-by swarm"), a sixth of a
standby. "file_descriptor", torch's default on Linux, hands the same bytes over as file descriptors and needs no
manager process (https://pytorch.org/docs/stable/multiprocessing.html#sharing-strategies).

Children inherit the environment: the DHT process hivemind forks, the p2p daemon it starts, and the processes a
LocalSwarm forks from its preloading server (client/local/preimported.py). A value the user set is kept.
"""
from __future__ import annotations

import os

__all__ = ["PROCESS_ENVIRONMENT", "prepare_process_environment"]

PROCESS_ENVIRONMENT = {"HIVEMIND_MEMORY_SHARING_STRATEGY": "file_descriptor"}


def prepare_process_environment() -> None:
    """Sets PROCESS_ENVIRONMENT's variables the user has not set; call it before the first import of hivemind."""
    for name, value in PROCESS_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
