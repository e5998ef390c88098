"""The checkpoints a swarm may go back to: the roots its plans' named savers published, recorded as they appear.

A resume or a rollback loads every layer from whoever advertises a checkpoint of it (coordinator/state_plan.py).
Taken on the holders' word, one peer advertising a complete checkpoint of a recent step would choose the model a
swarm goes back to, and one holder of a forged copy would tie with the honest saver on the digest of each unit. So
the coordinator records, for each step, the root (CheckpointInfo.root) that each stage's named saver
(CheckpointPlan.savers) advertises for its stage's layers under the plan that named it, the first one it sees; a
resume counts only checkpoints whose root is recorded, and its plan names those roots (Handoff.checkpoint_roots),
against which every member checks the units it downloads (client/training/state_handoff.py). The record is kept in
the coordinator's state file; a coordinator that lost it has recorded nothing and goes back to what the holders
advertise, as before, and says so.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hetswarm.protocol.records import Assignment, CheckpointInfo, CheckpointRoot, PeerRecord

__all__ = ["CheckpointLedger", "Layers", "MAX_RECORDED_STEPS", "Recorded"]

Layers = tuple[int, int]
Recorded = dict[int, dict[Layers, str]]
"""Step → layer range → root."""

MAX_RECORDED_STEPS = 8
"""The newest checkpoint steps recorded; a saver keeps its newest two (checkpoints.CheckpointDir.keep)."""
_PLANS_FOLLOWED = 8
"""Plans whose savers still count: a saver's record may reach us after the plan that named it was replaced."""
_ROOT = re.compile(r"^[0-9a-f]{64}$")


class CheckpointLedger:
    """The recorded roots (module docstring) and the savers whose checkpoints are recorded."""

    def __init__(self, recorded: Mapping[int, Mapping[Layers, str]] | None = None) -> None:
        self.recorded: Recorded = {step: dict(roots) for step, roots in (recorded or {}).items()}
        self._savers: dict[int, dict[Layers, str]] = {}
        """Plan version → layer range → the saver it named."""

    def follow(self, plan: Assignment) -> None:
        """Counts the checkpoints `plan`'s savers write under it (and, for a while, those of the plans before)."""
        if plan.checkpoints is not None:
            self._savers[plan.version] = {tuple(plan.stage_layers[stage]): saver
                                          for stage, saver in enumerate(plan.checkpoints.savers) if saver is not None}
        for version in sorted(self._savers)[:-_PLANS_FOLLOWED]:
            del self._savers[version]

    def observe(self, records: Mapping[str, PeerRecord]) -> bool:
        """Records the roots the named savers advertise; whether the record changed."""
        before = {step: dict(roots) for step, roots in self.recorded.items()}
        for peer, record in records.items():
            for info in record.checkpoints:
                layers = (info.layers[0], info.layers[1])
                if info.root is not None and self._savers.get(info.plan_version, {}).get(layers) == peer:
                    self.recorded.setdefault(info.step, {}).setdefault(layers, info.root)
        for step in sorted(self.recorded)[:-MAX_RECORDED_STEPS]:
            del self.recorded[step]
        return self.recorded != before

    def contradicted(self, records: Mapping[str, PeerRecord], n_layers: int) -> dict[str, str]:
        """The peers whose advertised checkpoints the ledger shows false, with why, for the coordinator's flags:
        layers the model does not have, a checkpoint written under a plan we follow that named another saver of
        those layers (only named savers write one: client/training/plan_session.py), or a root other than the one
        recorded for that step and layer range. What the ledger cannot check (a plan it no longer follows) is
        not flagged: `vouches` leaves it out of a resume all the same."""
        found = {}
        for peer, record in records.items():
            if why := next(filter(None, (self._contradiction(peer, info, n_layers) for info in record.checkpoints)),
                           None):
                found[peer] = why
        return found

    def _contradiction(self, peer: str, info: CheckpointInfo, n_layers: int) -> str | None:
        """What the ledger holds against `peer`'s advertised checkpoint `info` (`contradicted`), or None."""
        layers, step = (info.layers[0], info.layers[1]), info.step
        savers, recorded = self._savers.get(info.plan_version), self.recorded.get(step, {}).get(layers)
        if layers[1] > n_layers:
            return f"advertises a checkpoint of layers {list(layers)}; the model has {n_layers}"
        if savers is not None and savers.get(layers) != peer:
            return (f"advertises a checkpoint of layers {list(layers)} at step {step} written under "
                    f"plan v{info.plan_version}, which named another saver of them")
        if recorded is not None and info.root != recorded:
            return (f"advertises a checkpoint of layers {list(layers)} at step {step} with root "
                    f"{str(info.root)[:12]}…, not the {recorded[:12]}… its saver wrote")
        return None

    def vouches(self, info: CheckpointInfo) -> bool:
        """Whether `info` is a checkpoint a named saver wrote; every checkpoint, while nothing is recorded."""
        if not self.recorded:
            return True
        return info.root is not None and self.recorded.get(info.step, {}).get(tuple(info.layers)) == info.root

    def roots(self, step: int) -> list[CheckpointRoot]:
        """The roots recorded for `step`, for a resume's Handoff."""
        return [CheckpointRoot(layers=list(layers), root=root)
                for layers, root in sorted(self.recorded.get(step, {}).items())]

    def to_json(self) -> dict[str, dict[str, str]]:
        return {str(step): {f"{a}-{b}": root for (a, b), root in roots.items()}
                for step, roots in self.recorded.items()}

    @classmethod
    def from_json(cls, data: Any) -> CheckpointLedger:
        """Raises: ValueError, TypeError on data that is not a ledger's."""
        recorded: Recorded = {}
        if not isinstance(data, dict) or not all(isinstance(roots, dict) for roots in data.values()):
            raise TypeError(f"recorded checkpoints are not a mapping of mappings: {data!r:.80}")
        for step, roots in data.items():
            for layers, root in roots.items():
                a, b = (int(end) for end in str(layers).split("-"))
                if not (isinstance(root, str) and _ROOT.match(root)) or not 0 <= a < b:
                    raise ValueError(f"not a recorded checkpoint: step {step}, layers {layers}, root {root!r}")
                recorded.setdefault(int(step), {})[a, b] = root
        return cls(recorded)
