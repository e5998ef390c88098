"""Where a new plan's training state comes from: the step it starts at, who hands the state off, who checkpoints.

A plan that follows another starts at the step the previous plan's surviving members all hold (`start_step` in
run_state.py) and lists them as the sources its newcomers download from (client/training/state_handoff.py). A
member holds the state of its stage's layers once it has it: it kept them from the plan before (`kept_state`), or
said it started its stage (a Progress record of the plan with the state's origin); a member moved in that never got
its state (its source died with the others of its stage) holds nothing. The survivors cover the model when every
layer has a holder; the plan is then a hand-off. When some layers have no surviving replica, the swarm goes back, as a whole, to the newest
step whose checkpoints (advertised in the peers' records) cover every layer: a resume. When nothing covers them
either, the coordinator waits (the peer may come back with its checkpoint) and, once it has waited long enough, says
the layers are lost and lets them start again from the seed, so that the rest of the model keeps training.

A fresh run (no previous plan, or one at step 0) starts from the seed unless peers hold checkpoints: a swarm stopped
and started again resumes from them. Only checkpoints whose roots the coordinator recorded from their named savers
count, and the plan names those roots (coordinator/checkpoint_ledger.py).

Checkpoints: one saver per stage, a replica that keeps checkpoints (`PeerRecord.checkpointing`), the lowest peer id;
every `every` steps, so that the stages' checkpoints meet at the same steps.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from hetswarm.coordinator.checkpoint_ledger import CheckpointLedger
from hetswarm.protocol.records import Assignment, CheckpointPlan, Handoff, PeerRecord, Progress

__all__ = ["StatePlan", "checkpoint_plan", "kept_state", "layer_ranges", "newest_complete_checkpoint",
           "plan_state", "rollback_state"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StatePlan:
    step: int
    handoff: Handoff | None
    """None: a fresh run from the seed."""
    note: str = ""
    """What the plan's reason should add: a resume or lost layers."""


def plan_state(*, previous: Assignment | None, live_step: int, alive: Collection[str],
               records: Mapping[str, PeerRecord], progress: Mapping[str, Progress], n_layers: int, give_up: bool,
               abandoned: Collection[tuple[int, int]] = (), kept: Collection[str] | None = None,
               ledger: CheckpointLedger | None = None) -> StatePlan | str:
    """The state a plan over `alive` peers starts from (module docstring), or why it cannot start yet.

    Args:
        live_step: `start_step` of the previous plan's survivors.
        kept: `kept_state` of the previous plan; None (a plan adopted after a coordinator restart) counts every member.
        ledger: the checkpoints a resume may load (None: every advertised one, as a ledger that recorded nothing).
        give_up: layers held by nobody start again from the seed (else the answer is a reason to wait).
        abandoned: (step, version) of each plan that went back to `step`: checkpoints of later steps written under
            older versions are of the trajectory it abandoned, and are never resumed from.
    """
    fresh = previous is None or live_step == 0  # nothing trained yet: nothing to lose
    holders = {} if fresh else _holders(previous, alive, progress, kept)
    missing = _uncovered(holders.values(), n_layers)
    if not missing:
        return StatePlan(step=live_step, handoff=Handoff(sources=sorted(holders)))
    resume = newest_complete_checkpoint(records, alive, n_layers, abandoned=abandoned, ledger=ledger)
    if resume is not None:
        why = "a fresh start" if fresh else f"no live replica of layers {_ranges(missing)}"
        return _resumed(resume, ledger, note=f"resumed from the checkpoints of step {resume[0]} ({why})")
    if fresh:
        return StatePlan(step=0, handoff=None)
    if not give_up:
        return f"layers {_ranges(missing)} have no live replica and no checkpoint; waiting for a peer that holds them"
    seeded = [list(r) for r in layer_ranges(missing)]
    return StatePlan(step=live_step, handoff=Handoff(sources=sorted(holders), seeded_layers=seeded),
                     note=f"layers {_ranges(missing)} lost (no replica, no checkpoint): they start again from the seed")


def rollback_state(records: Mapping[str, PeerRecord], alive: Collection[str], n_layers: int, *, before: int,
                   why: str, abandoned: Collection[tuple[int, int]] = (), ledger: CheckpointLedger | None = None
                   ) -> StatePlan | None:
    """The plan's state after a loss spike (coordinator/loss_watch.py): the newest complete checkpoint of a step
    below `before`, or None when there is none."""
    resume = newest_complete_checkpoint(records, alive, n_layers, before=before, abandoned=abandoned, ledger=ledger)
    if resume is None:
        return None
    return _resumed(resume, ledger, note=f"{why}: rolled back to the checkpoints of step {resume[0]}")


def _resumed(resume: tuple[int, list[str]], ledger: CheckpointLedger | None, *, note: str) -> StatePlan:
    step, sources = resume
    roots = ledger.roots(step) if ledger is not None else []
    if ledger is not None and not roots:
        note += "; no checkpoint roots recorded (the coordinator's state was lost?): the holders' word is taken"
    return StatePlan(step=step, note=note, handoff=Handoff(sources=sources, resumed_from_checkpoint=True,
                                                           checkpoint_roots=roots))


def checkpoint_plan(pipelines: list[list[str]], records: Mapping[str, PeerRecord], every: int) -> CheckpointPlan | None:
    """One saver per stage (module docstring); None when no placed peer keeps checkpoints."""
    savers = []
    for stage in range(len(pipelines[0])):
        keepers = sorted(chain[stage] for chain in pipelines if records.get(chain[stage]) is not None
                         and records[chain[stage]].checkpointing)
        savers.append(keepers[0] if keepers else None)
    return CheckpointPlan(savers=savers, every=every) if any(savers) else None


def layer_ranges(layers: Collection[int]) -> list[tuple[int, int]]:
    """Sorted layer indices as maximal [a, b) ranges."""
    ranges: list[tuple[int, int]] = []
    for layer in sorted(layers):
        if ranges and ranges[-1][1] == layer:
            ranges[-1] = (ranges[-1][0], layer + 1)
        else:
            ranges.append((layer, layer + 1))
    return ranges


def kept_state(plan: Assignment, previous: Assignment | None) -> frozenset[str]:
    """The members of `plan` that hold their stage's state from its start without downloading it: with a hand-off,
    the sources that keep the layers they had under `previous`, and the members whose layers all start from the
    seed; from the seed, all of them; after a resume, none (each loads checkpoints first)."""
    handoff = plan.handoff
    if handoff is None:
        return frozenset(plan.roles)
    if handoff.resumed_from_checkpoint or previous is None:
        return frozenset()
    sources, seeded = set(handoff.sources), {layer for a, b in handoff.seeded_layers for layer in range(a, b)}

    def keeps(peer: str, stage: int) -> bool:
        layers = tuple(plan.stage_layers[stage])
        if set(range(*layers)) <= seeded:
            return True
        role = previous.roles.get(peer)
        return peer in sources and role is not None and tuple(previous.stage_layers[role.stage]) == layers

    return frozenset(peer for peer, role in plan.roles.items() if keeps(peer, role.stage))


def _holders(previous: Assignment, alive: Collection[str], progress: Mapping[str, Progress],
             kept: Collection[str] | None) -> dict[str, tuple[int, int]]:
    """Surviving members of the previous plan that hold their stage's state (module docstring) and did not give up
    on it, with the layers they hold."""
    reports = {signer: record for signer, record in progress.items()
               if signer == record.peer_id and record.assignment_version == previous.version}
    started = {peer for peer, record in reports.items() if record.state_origin is not None}
    stalled = {peer for peer, record in reports.items() if record.health == "stalled"}
    return {peer: tuple(previous.stage_layers[role.stage]) for peer, role in previous.roles.items()
            if peer in alive and peer not in stalled and (kept is None or peer in kept or peer in started)}


def _uncovered(ranges: Collection[tuple[int, int]], n_layers: int) -> set[int]:
    covered = {layer for a, b in ranges for layer in range(a, b)}
    return set(range(n_layers)) - covered


def newest_complete_checkpoint(records: Mapping[str, PeerRecord], alive: Collection[str], n_layers: int, *,
                                before: int | None = None, abandoned: Collection[tuple[int, int]] = (),
                                ledger: CheckpointLedger | None = None) -> tuple[int, list[str]] | None:
    """The newest step (below `before`, when given) whose checkpoints, held by peers in view, vouched for by the
    `ledger` and not of an `abandoned` trajectory (`plan_state`), cover every layer, and the peers that hold them;
    a checkpoint of layers beyond the model's `n_layers` counts for nothing."""
    by_step: dict[int, dict[str, list[tuple[int, int]]]] = {}
    for peer, record in records.items():
        if peer not in alive:
            continue
        for info in record.checkpoints:
            if (before is not None and info.step >= before) or any(
                    info.step > step and info.plan_version < version for step, version in abandoned):
                continue
            if info.layers[1] > n_layers:  # not of this model: a forged or stale record
                continue
            if ledger is not None and not ledger.vouches(info):  # not what its named saver wrote
                continue
            by_step.setdefault(info.step, {}).setdefault(peer, []).append(tuple(info.layers))
    for step in sorted(by_step, reverse=True):
        held = by_step[step]
        if not _uncovered([r for ranges in held.values() for r in ranges], n_layers):
            return step, sorted(held)
    return None


def _ranges(layers: Collection[int]) -> str:
    return ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in layer_ranges(layers))
