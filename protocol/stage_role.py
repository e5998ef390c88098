"""One peer's part in one plan, read once from the assignment: the frozen value its stage is built from
(client/training/stage_start.py) and trained by (client/training/stage_passes.py), so that nothing below the plan
session reads the assignment record again."""
from __future__ import annotations

from dataclasses import dataclass

from hetswarm.protocol.keys import ReadyStep
from hetswarm.protocol.model_config import ModelConfig, PipelineSchedule
from hetswarm.protocol.records import Aggregation, Assignment
from hetswarm.protocol.wire_format import WireFormat

__all__ = ["StageRole"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StageRole:
    """Stage `stage` of pipeline `pipeline` in plan `version`, as `peer_id` runs it."""

    peer_id: str
    version: int
    stage: int
    pipeline: int
    pipelines: tuple[tuple[str, ...], ...]
    """Pipeline r: the peer of each stage, in stage order."""
    stage_layers: tuple[tuple[int, int], ...]
    """Layer range [a, b) of every stage, as the plan cut the model."""
    model: ModelConfig
    """With the plan's micro-batch count (Assignment.model_config)."""
    wire: WireFormat
    schedule: PipelineSchedule
    recompute: bool
    aggregation: Aggregation
    first_step: ReadyStep
    """The step the stage's state is ready for when it starts."""
    eval_every: int

    @classmethod
    def of(cls, assignment: Assignment, peer_id: str) -> StageRole:
        """Raises: ValueError: `peer_id` has no role in the plan, or its model fields do not make a ModelConfig."""
        if (role := assignment.roles.get(peer_id)) is None:
            raise ValueError(f"{peer_id} has no role in assignment version {assignment.version}")
        return cls(peer_id=peer_id, version=assignment.version, stage=role.stage, pipeline=role.replica,
                   pipelines=tuple(tuple(chain) for chain in assignment.pipelines),
                   stage_layers=tuple((a, b) for a, b in assignment.stage_layers), model=assignment.model_config(),
                   wire=assignment.wire_format(), schedule=assignment.schedule, recompute=assignment.recompute,
                   aggregation=assignment.aggregation, first_step=assignment.step, eval_every=assignment.eval_every)

    @property
    def d_pp(self) -> int:
        return len(self.stage_layers)

    @property
    def d_dp(self) -> int:
        return len(self.pipelines)

    @property
    def layers(self) -> tuple[int, int]:
        return self.stage_layers[self.stage]

    @property
    def neighbours(self) -> tuple[str | None, str | None]:
        """The peers before and after this stage in its pipeline; None at either end."""
        chain = self.pipelines[self.pipeline]
        return (chain[self.stage - 1] if self.stage > 0 else None,
                chain[self.stage + 1] if self.stage + 1 < self.d_pp else None)

    @property
    def group(self) -> tuple[str, ...]:
        """This stage's replicas, one per pipeline: the peers it all-reduces gradients with."""
        return tuple(chain[self.stage] for chain in self.pipelines)

    @property
    def partners(self) -> frozenset[str]:
        """The peers this stage exchanges frames, votes or gradients with: its neighbours and its group."""
        return frozenset(peer for peer in (*self.neighbours, *self.group) if peer is not None) - {self.peer_id}

    @property
    def members(self) -> tuple[str, ...]:
        """Every peer of the plan: the voters on each step's commit."""
        return tuple(peer for chain in self.pipelines for peer in chain)

    @property
    def tied_holders(self) -> tuple[str, ...]:
        """The first and last stages of every pipeline: the holders of a tied embedding matrix's copies."""
        return tuple(chain[stage] for chain in self.pipelines for stage in (0, self.d_pp - 1))
