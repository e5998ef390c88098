"""Checkpoints on a volunteer's disk: the state of its stage, written without stalling training and never half.

`hetswarm join --checkpoint-dir DIR` keeps them under ``DIR/<swarm>/``: for the state of layers [a, b) ready for step
S, ``layers-a-b-step-S.state`` (the deterministic encoding of client/training/stage_state.py) and beside it
``layers-a-b-step-S.json`` (step, layers, model config, plan version, SHA-256 and size, and the root of its units'
digests that the peer's record advertises: stage_state.units_root). The data file is written
first and the JSON last, each to a temporary file that is fsynced and renamed (protocol/atomic_files.py), so a
checkpoint whose JSON exists is whole; a crash mid-write leaves the previous ones. The newest ``keep`` checkpoints
of each layer range stay.

The plan names one saver per stage and the steps (multiples of ``CheckpointPlan.every``), so that every stage's
checkpoints meet at the same steps and a swarm can go back to one of them as a whole.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hetswarm.client.training.stage_state import (
    StageState,
    decode_tensors,
    merged,
    unit_digests,
    unit_encodings,
    unit_of,
    units_of_layers,
    units_root,
)
from hetswarm.protocol.atomic_files import write_bytes, write_json
from hetswarm.protocol.errors import ConfigError, RejectedInput
from hetswarm.protocol.keys import check_swarm_name
from hetswarm.protocol.limits import MAX_CHECKPOINTS_PER_RECORD
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.records import CheckpointInfo

__all__ = ["CheckpointDir", "CheckpointMeta", "CheckpointWriter", "newest_whole_model"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointMeta:
    step: int
    layers: tuple[int, int]
    model: dict
    plan_version: int
    digest: str
    """SHA-256 of the data file, hex."""
    size: int
    path: Path
    """The data file."""
    root: str | None = None
    """`units_root` of its units' digests; None in a checkpoint written before checkpoints had one."""

    def info(self) -> CheckpointInfo:
        return CheckpointInfo(step=self.step, layers=list(self.layers), plan_version=self.plan_version,
                              root=self.root)


class CheckpointDir:
    """The checkpoints of one swarm in a folder; every method is blocking (call it from a worker thread)."""

    def __init__(self, root: Path, swarm: str, *, keep: int = 2) -> None:
        self.folder, self.keep = Path(root) / check_swarm_name(swarm), keep

    def save(self, state: StageState, *, layers: tuple[int, int], model: ModelConfig, plan_version: int
             ) -> CheckpointMeta:
        """Writes ``state`` (which must hold exactly the units of ``layers``) durably, then drops older ones."""
        a, b = layers
        if state.units != sorted(units_of_layers(layers, model.n_layers)):
            raise ValueError(f"state holds {state.units}, not the units of layers [{a}, {b})")
        encodings = unit_encodings(state)  # each unit encoded once: for the file and for the root
        blob = b"".join(encodings.values())
        stem = f"layers-{a}-{b}-step-{state.step}"
        data_path = self.folder / f"{stem}.state"
        write_bytes(data_path, blob, durable=True)
        meta = CheckpointMeta(step=state.step, layers=(a, b), model=model.to_dict(), plan_version=plan_version,
                              digest=hashlib.sha256(blob).hexdigest(), size=len(blob), path=data_path,
                              root=units_root(unit_digests(encodings)))
        write_json(self.folder / f"{stem}.json", {
            "step": meta.step, "layers": [a, b], "model": meta.model, "plan_version": plan_version,
            "digest": meta.digest, "size": meta.size, "root": meta.root, "saved_at": time.time()}, durable=True)
        self._prune(layers)
        return meta

    def list(self) -> list[CheckpointMeta]:
        """Whole checkpoints, newest first; unreadable ones are skipped (and logged)."""
        found = []
        for json_path in self.folder.glob("layers-*-step-*.json"):
            try:
                data = json.loads(json_path.read_text())
                a, b = data["layers"]
                meta = CheckpointMeta(step=int(data["step"]), layers=(int(a), int(b)), model=data["model"],
                                      plan_version=int(data["plan_version"]), digest=str(data["digest"]),
                                      size=int(data["size"]), path=json_path.with_suffix(".state"),
                                      root=data.get("root"))
                meta.info()  # what the record will advertise must be valid (pydantic's errors are ValueErrors)
                found.append(meta)
            except (OSError, ValueError, KeyError, TypeError) as e:
                logger.warning(f"Skipped the checkpoint {json_path}: {type(e).__name__}: {e}")
        return sorted(found, key=lambda meta: (-meta.step, meta.layers))

    def infos(self) -> list[CheckpointInfo]:
        """What a peer record advertises: the newest checkpoints."""
        return [meta.info() for meta in self.list()[:MAX_CHECKPOINTS_PER_RECORD]]

    def find_part(self, step: int, units: list[str]) -> StageState | None:
        """Those of ``units`` the checkpoints of ``step`` hold, each checked against its digest; None when they hold
        none (a corrupt one is logged and skipped)."""
        part, missing = None, set(units)
        for meta in (meta for meta in self.list() if meta.step == step):
            held = missing & set(units_of_layers(meta.layers, int(meta.model.get("n_layers", 0))))
            if not held:
                continue
            try:
                part = merged(part, self.load(meta).select(sorted(held)))
            except (OSError, RejectedInput) as e:
                logger.warning(f"Skipped the checkpoint {meta.path}: {e}")
                continue
            missing -= held
        return part

    def load(self, meta: CheckpointMeta) -> StageState:
        """Raises: OSError, RejectedInput (the data does not match its digest or is not a state)."""
        blob = meta.path.read_bytes()
        if hashlib.sha256(blob).hexdigest() != meta.digest:
            raise RejectedInput(f"checkpoint {meta.path} does not match its SHA-256")
        tensors = decode_tensors(blob)
        if {unit_of(name) for name in tensors} != set(units_of_layers(meta.layers, int(meta.model["n_layers"]))):
            raise RejectedInput(f"checkpoint {meta.path} holds other units than layers {meta.layers}")
        return StageState(meta.step, tensors)

    def _prune(self, layers: tuple[int, int]) -> None:
        for meta in [m for m in self.list() if m.layers == layers][self.keep:]:
            for path in (meta.path, meta.path.with_suffix(".json")):
                path.unlink(missing_ok=True)


def newest_whole_model(folders: Sequence[CheckpointDir]) -> tuple[ModelConfig, StageState]:
    """The newest step that the checkpoints in ``folders`` (one per peer, each holding some stages) hold every
    layer of, assembled from them with every digest checked; the optimizer state is kept in the tensors.

    Raises:
        ConfigError: no checkpoints, or no step whose checkpoints cover the model (the newest step's gap is named).
    """
    metas = [meta for folder in folders for meta in folder.list()]
    if not metas:
        raise ConfigError(f"no checkpoints in {', '.join(str(folder.folder) for folder in folders)}")
    gaps = []
    for step in sorted({meta.step for meta in metas}, reverse=True):
        model = ModelConfig.from_dict(next(meta.model for meta in metas if meta.step == step))
        needed = units_of_layers((0, model.n_layers), model.n_layers)
        whole = None
        for folder in folders:
            missing = sorted(set(needed) - set(whole.units if whole else ()))
            if missing:
                whole = merged(whole, folder.find_part(step, missing))
        lacking = sorted(set(needed) - set(whole.units if whole else ()))
        if not lacking:
            return model, whole
        gaps.append(f"step {step} lacks {', '.join(lacking)}")
    raise ConfigError(f"no step whose checkpoints hold the whole model: {'; '.join(gaps[:3])}")


class CheckpointWriter:
    """Writes checkpoints in a worker thread, one at a time, from a state that is already a copy; a checkpoint due
    while the previous one is still being written is skipped (and logged) rather than queued."""

    def __init__(self, checkpoints: CheckpointDir) -> None:
        self.checkpoints = checkpoints
        self.last: CheckpointMeta | None = None
        self.on_saved: Callable[[], None] | None = None
        """Called after each checkpoint is written: the peer's record, which lists them, should go out now."""
        self._writing: asyncio.Task | None = None

    def submit(self, state: StageState, *, layers: tuple[int, int], model: ModelConfig, plan_version: int) -> None:
        if self._writing is not None and not self._writing.done():
            logger.warning(f"Checkpoint of step {state.step} skipped: the previous one is still being written")
            return
        self._writing = asyncio.create_task(self._write(state, layers=layers, model=model, plan_version=plan_version))

    async def _write(self, state: StageState, **kwargs) -> None:
        started = time.perf_counter()
        try:
            meta = await asyncio.to_thread(self.checkpoints.save, state, **kwargs)
        except OSError as e:
            logger.warning(f"Could not write the checkpoint of step {state.step}: {e}")
            return
        self.last = meta
        logger.info(f"Checkpoint of step {meta.step} (layers {meta.layers[0]}-{meta.layers[1]}): {meta.size} bytes "
                    f"in {time.perf_counter() - started:.2f} s, {meta.path}")
        if self.on_saved is not None:
            self.on_saved()

    async def close(self) -> None:
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
