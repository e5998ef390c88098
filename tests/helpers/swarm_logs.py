"""What the whole-swarm scenarios give their `hetswarm` processes and read from them: the model file they train, the
coordinator's options of the golden run's plan, and the losses their logs print."""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from tests.helpers.golden_runs import TINY_FP32
from tests.helpers.tiny_training import D_DP, D_PP, SEED

STEP_LOSS = re.compile(r"step (\d+): loss ([0-9.]+)")
JOINED = re.compile(r"Others can join with: --initial-peers (\S+)")


def model_file(tmp: Path) -> Path:
    """TINY_FP32 as a `--model` file: the golden run's model, trained by `hetswarm` processes."""
    path = tmp / f"{TINY_FP32.name}.json"
    path.write_text(json.dumps(TINY_FP32.to_dict()))
    return path


def golden_plan_args(checkpoint_every: int) -> tuple[str, ...]:
    """`hetswarm coordinator` options that plan the golden run's 2 × 2 shape and keep it (loopback links: a search
    that chases their noise never pays for moves), checkpointing every `checkpoint_every` steps."""
    return ("--dp", str(D_DP), "--pp", str(D_PP), "--ttl", "20", "--debounce", "1", "--measure-wait", "20",
            "--time-budget", "1", "--reconsider", "3600", "--payback-steps", "0",
            "--checkpoint-every", str(checkpoint_every), "--seed", str(SEED))


def logged_losses(logs: Iterable[Path], *, since: dict[Path, int] | None = None,
                  last_only: bool = False) -> dict[int, list[float]]:
    """Every loss the logs print, by step (each last-stage client logs its pipeline's), read from the byte offsets
    `since`; with `last_only`, each log's last loss of a step (a step re-run after a rollback replaces it)."""
    found: dict[int, list[float]] = {}
    for log in sorted(logs):
        with open(log, "rb") as file:
            file.seek((since or {}).get(log, 0))
            pairs = STEP_LOSS.findall(file.read().decode(errors="replace"))
        per_step = [(int(step), float(loss)) for step, loss in pairs]
        for step, loss in (dict(per_step).items() if last_only else per_step):
            found.setdefault(step, []).append(loss)
    return found
