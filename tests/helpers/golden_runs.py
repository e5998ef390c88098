"""Golden runs: each deterministic fault-free configuration of the tiny swarm, trained once per test session.

Many scenarios end by comparing their model with "a run with the same data and no fault" (step faults, compressed
training, the state that outlives peers, the hostile swarm, the loss rollback). Such a run depends only on its
configuration (model, wire, shape, optimizer, seed, data), so it is trained once, for the longest step count any
test needs, and every comparison reads it: its per-step reports, the parameters after the step counts the tests
compare at, and the first step's gradients.

Under pytest-xdist each worker is a session of its own; the first worker to ask trains the run while holding a
file lock in the directory the workers share, and the others wait for the lock and read the saved result (the
pattern of pytest-xdist's "Making session-scoped fixtures execute only once").
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import torch
from filelock import FileLock

from hetswarm.client.peer.node import end_processes
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.model_config import ModelConfig
from tests.helpers.tiny_training import D_DP, D_PP, SEED, TINY, train_swarm


@dataclass(frozen=True)
class GoldenRun:
    """One deterministic 2 × 2 fault-free configuration and what its readers need of it."""

    name: str
    model: ModelConfig
    config: StageConfig
    steps: int
    states_after: tuple[int, ...] = ()
    """Step counts after which the parameters are kept (the run's last step is always among them)."""
    first_grads: bool = False
    data_seed: int = 0
    eval_every: int = 0
    """The plan's held-out loss period (Assignment.eval_every); the evaluation changes no weight."""

    def train(self, tmp: Path) -> list[dict]:
        return train_swarm(tmp, swarm=f"golden-{self.name}", steps=self.steps, model=self.model, seed=SEED,
                           data_seed=self.data_seed, config=self.config, save_first_grads=self.first_grads,
                           runs={"eval_every": self.eval_every},
                           save_states_after=tuple(sorted({*self.states_after, self.steps})), timeout_s=300)


LR3_CONFIG = StageConfig(lr=3e-3, frame_timeout_s=8, sender_timeout_s=10, reducer_timeout_s=20, start_timeout_s=60,
                         commit_timeout_s=30, max_attempts=3, check_every=2)
"""The training tests' stage config: replicas compare states every second step, timeouts short enough that a
fault is noticed within a step."""

TINY_RUN = GoldenRun("tiny", TINY, LR3_CONFIG, steps=30, states_after=(6,), first_grads=True, eval_every=6)
"""tests/test_training_correctness.py reads its 30 steps, first gradients and held-out losses; tests/test_step_faults.py
and tests/test_compressed_training.py its parameters after 6 steps."""

TINY_FP32 = replace(TINY, name="tiny-fp32", activation_bytes_per_value=4,
                    micro_batches=TINY.batch_tokens // TINY.seq_len // D_DP)
"""The tiny model with fp32 activations on the wire, so that a swarm of `hetswarm` processes is exact, and one
sequence per micro-batch, so that every way the coordinator may run it (execution_options) sums the gradients in
the same order as the golden run: the equalities of the whole-swarm scenarios are about state surviving failures,
not about the choice of schedule."""

CHECKPOINT_EVERY = 4
"""The whole-swarm scenarios' checkpoint period: they end on a checkpoint's step plus a whole number of periods."""

SWARM_RUN = GoldenRun("tiny-fp32", TINY_FP32, StageConfig(), steps=160,
                      states_after=tuple(range(CHECKPOINT_EVERY, 160, CHECKPOINT_EVERY)), data_seed=SEED)
"""What `hetswarm join --seed SEED` clients train by default on TINY_FP32: the losses and checkpoints of
tests/test_state_survives.py, tests/test_hostile_swarm.py and tests/test_loss_rollback.py."""


def golden_results(run: GoldenRun, shared: Path) -> list[dict]:
    """The run's per-process results (peer order), trained by whichever worker asks first and kept in `shared`."""
    saved = shared / f"golden-{run.name}.pt"
    with FileLock(str(saved) + ".lock"):
        if not saved.exists():
            (folder := shared / f"golden-{run.name}").mkdir(exist_ok=True)
            results = run.train(folder)
            torch.save(results, saved.with_suffix(".tmp"))
            saved.with_suffix(".tmp").rename(saved)
    return torch.load(saved)


@contextlib.contextmanager
def golden_results_beside(run: GoldenRun, shared: Path, timeout_s: float = 600) -> Iterator[Callable[[], list[dict]]]:
    """Starts `golden_results` in a process of its own, so that a scenario can play while the run it is compared
    with trains (the scenario mostly waits for its swarm); yields the function that waits for it and returns it. Its
    own process, not a thread: the run reaps its children when it ends (train_swarm), and would reap the
    scenario's too."""
    with open(shared / f"golden-{run.name}-beside.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "tests.helpers.golden_runs", run.name, str(shared)],
                                   cwd=Path(__file__).parents[2], stdout=log, stderr=subprocess.STDOUT)

    def result() -> list[dict]:
        assert process.wait(timeout=timeout_s) == 0, f"training the golden run failed: see {log.name}"
        return golden_results(run, shared)
    try:
        yield result
    finally:
        if process.poll() is None:
            trainer = psutil.Process(process.pid)
            end_processes([trainer, *trainer.children(recursive=True)])
            process.wait()


def final_state(results: list[dict], steps: int) -> dict[str, torch.Tensor]:
    """The whole model after `steps` steps: each stage's parameters from its first replica."""
    return {name: tensor for result in results if result["replica"] == 0
            for name, tensor in _state(result, steps).items()}


def states(results: list[dict], steps: int) -> list[dict[str, torch.Tensor]]:
    """Each process's parameters after `steps` steps, in peer order."""
    return [_state(result, steps) for result in results]


def _state(result: dict, steps: int) -> dict[str, torch.Tensor]:
    kept = result["states"]
    assert steps in kept, f"the golden run kept the parameters after {sorted(kept)} steps, not after {steps}"
    return kept[steps]


def losses(results: list[dict], steps: int) -> dict[int, list[float]]:
    """Every pipeline's loss at each of the first `steps` steps (the last stage logs its pipeline's)."""
    last = [result for result in results if result["stage"] == D_PP - 1]
    assert all(len(result["reports"]) >= steps for result in last), f"the golden run has fewer than {steps} steps"
    return {step: [result["reports"][step]["loss"] for result in last] for step in range(steps)}


if __name__ == "__main__":  # golden_results_beside: python -m tests.helpers.golden_runs NAME SHARED_FOLDER
    golden_results({run.name: run for run in (TINY_RUN, SWARM_RUN)}[sys.argv[1]], Path(sys.argv[2]))
