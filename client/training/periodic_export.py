"""`hetswarm coordinator --export-every N --export-dir DIR`: the live model as a Hugging Face folder every N steps.

Each export fetches the whole model from the members of the plan in force through the state hand-off path
(state_handoff.fetch_model: the newest step every member holds, each unit checked against the digest most of its
holders report, so one member cannot slip in its own weights) and writes it as DIR/step-K with
hf_folder.export_folder, which appears whole or not at all. K is the step the members held, at least the multiple of
N that was due. A coordinator restarted on the same DIR goes on after the newest folder there.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hivemind

from hetswarm.client.training.hf_folder import export_folder
from hetswarm.client.training.prepared_data import PreparedData
from hetswarm.client.training.state_handoff import StateUnavailable, download_model
from hetswarm.protocol.records import Assignment

__all__ = ["PeriodicExport", "exported_steps"]

logger = logging.getLogger(__name__)

_FOLDER = re.compile(r"step-(\d+)")


def exported_steps(folder: Path) -> list[int]:
    """The steps of the complete exports in `folder`, oldest first (a partial one is hidden: export_folder)."""
    if not folder.is_dir():
        return []
    return sorted(int(match[1]) for path in folder.iterdir() if (match := _FOLDER.fullmatch(path.name)))


@dataclass
class PeriodicExport:
    """Exports the live model whenever the plan's committed step reaches the next multiple of `every`."""

    dht: hivemind.DHT
    swarm: str
    every: int
    folder: Path
    current: Callable[[], tuple[Assignment | None, int]]
    """The plan in force and the step its members all hold (the coordinator's)."""
    data: PreparedData | None = None
    """The prepared data the plan is pinned to: its tokenizer goes into every export."""
    timeout_s: float = 60.0
    poll_s: float = 1.0
    retry_s: float = 10.0
    """After a failed export (members busy handing off, say), the next try waits this long."""
    due: int = field(init=False, default=0)
    """The step the next export waits for."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"--export-every must be positive, got {self.every}")
        done = exported_steps(self.folder)
        self.due = self._after(done[-1]) if done else self.every

    def _after(self, step: int) -> int:
        return (step // self.every + 1) * self.every

    async def watch(self, stop: asyncio.Event) -> None:
        """Exports until `stop` is set; a failed export is logged and tried again (it never stops the coordinator)."""
        while not stop.is_set():
            plan, step = self.current()
            pause = self.poll_s
            if plan is not None and step >= self.due:
                try:
                    await self.export(plan)
                except (StateUnavailable, OSError, ValueError) as e:
                    logger.warning(f"Export of step {self.due} failed ({type(e).__name__}: {e}); trying again "
                                   f"in {self.retry_s:.0f} s")
                    pause = self.retry_s
            try:
                await asyncio.wait_for(stop.wait(), timeout=pause)
            except TimeoutError:
                pass

    async def export(self, plan: Assignment) -> Path:
        """One export of the model the members of `plan` hold now."""
        state = await download_model(self.dht, self.swarm, plan, timeout_s=self.timeout_s)
        out = self.folder / f"step-{state.step}"
        if not out.exists():  # export_folder takes the parameters, not AdamW's moments
            await asyncio.to_thread(export_folder, plan.model_config(), state.tensors, out, self.data)
            logger.info(f"Exported the model of plan v{plan.version} at step {state.step} to {out}")
        self.due = self._after(state.step)
        return out
