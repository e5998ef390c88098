"""Everything drawn for people: the monitor's tables and the demo's live view and summary (rich).

The monitor draws the JSON form of a SwarmSnapshot (what `--json` prints), so the two views cannot disagree.
"""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from hetswarm.client.local.demo import SAMPLE_PROMPT, DemoWatch, PhaseResult
from hetswarm.protocol.keys import short_id
from hetswarm.protocol.wire_format import WireFormat

__all__ = ["render", "render_watch", "shown", "summary_lines"]


def shown(text: str | None) -> str:
    """A peer's own words (its name, site, device, a reason quoting them) as the terminal shows them: rich markup
    escaped and unprintable characters (terminal escapes among them) replaced, so no peer can break or restyle the
    view."""
    return escape("".join(char if char.isprintable() else "?" for char in text or ""))


def peers_table(snapshot: dict[str, Any]) -> Table:
    table = Table(title=f"swarm {snapshot['swarm']!r}: {snapshot['counts']['peers']} peers")
    for column in ("peer", "name", "site", "device", "TFLOPS", "memory GiB", "state", "role", "last heard"):
        table.add_column(column, justify="right" if column in ("TFLOPS", "memory GiB", "last heard") else "left")
    for p in snapshot["peers"]:
        table.add_row(p["short_id"], shown(p["name"]), shown(p["site"]), shown(p["device_name"]), f"{p['tflops']:.2f}",
                      f"{p['memory_gib']:.1f}", p["state"], _role(p), f"{p['last_heard_s']:.0f} s ago")
    return table


def _role(peer: dict[str, Any]) -> str:
    if peer["assignment_version"] is None:
        return ""
    role = peer["role"]
    where = "standby" if role is None else f"stage {role['stage']}, replica {role['replica']}"
    return f"v{peer['assignment_version']}: {where}"


def links_table(snapshot: dict[str, Any]) -> Table:
    """Latency / bandwidth from each row's peer to each column's peer; `?` where nobody measured."""
    ids = [p["peer_id"] for p in snapshot["peers"]]
    measured = {(link["src"], link["dst"]): link for link in snapshot["links"]}
    counts = snapshot["counts"]
    estimated = {frozenset((link["src"], link["dst"])): link for link in snapshot.get("estimated_links", [])}
    error = snapshot.get("estimate_error")
    table = Table(title=f"links, ms / Mbit/s ({counts['pairs_measured']} of {counts['pairs']} pairs measured; "
                        f"~ estimated{f', {error}' if error else ''})")
    table.add_column("from \\ to")
    for peer in ids:
        table.add_column(short_id(peer), justify="right")
    for src in ids:
        cells = []
        for dst in ids:
            link = measured.get((src, dst))
            guess = estimated.get(frozenset((src, dst)))
            cells.append("—" if src == dst else f"{link['latency_ms']:.0f} / {link['bandwidth_mbps']:.0f}" if link
                         else f"~{guess['latency_ms']:.0f} / {guess['bandwidth_mbps']:.0f}" if guess else "")
        table.add_row(short_id(src), *cells)
    return table


def assignment_table(assignment: dict[str, Any]) -> Group:
    """Stage × replica grid (name and site of each peer), the pipelines' chains, the bottleneck and the prediction."""
    def label(peer: dict[str, Any]) -> str:
        text = f"{shown(peer['name'] or short_id(peer['peer_id']))} ({shown(peer['site'] or '?')})"
        return text if peer["alive"] else f"[red]{text} gone[/red]"

    grid = Table(title=f"assignment v{assignment['version']} ({shown(assignment['model'])}): {assignment['d_dp']} "
                       f"pipelines × {assignment['d_pp']} stages, {assignment['micro_batches']} micro-batches — "
                       f"{shown(assignment['reason'])}")
    grid.add_column("stage (layers)")
    for replica in range(assignment["d_dp"]):
        grid.add_column(f"replica {replica}")
    for stage, (row, (a, b)) in enumerate(zip(assignment["grid"], assignment["stage_layers"])):
        grid.add_row(f"{stage} [{a}, {b})", *(label(peer) for peer in row))
    lines = [f"pipeline {r}: " + " → ".join(label(peer) for peer in chain)
             for r, chain in enumerate(assignment["pipelines"])]
    if assignment["standbys"]:
        lines.append("standby: " + ", ".join(label(peer) for peer in assignment["standbys"]))
    if (link := assignment["bottleneck_link"]) is not None:
        lines.append(f"bottleneck link: stage {link['stage']}→{link['stage'] + 1} of pipeline {link['pipeline']}, "
                     f"{label(link['src'])} → {label(link['dst'])}: {link['latency_ms']:.0f} ms, "
                     f"{link['bandwidth_mbps']:.0f} Mbit/s{' (estimated)' if link['estimated'] else ''}, "
                     f"{link['micro_batch_s']:.3f} s per micro-batch")
    parts = ", ".join(f"{k} {v:.3f}" for k, v in assignment["breakdown"].items() if k != "step_s")
    lines.append(f"predicted step {assignment['predicted_step_s']:.3f} s ({parts}); "
                 f"{assignment['followers']} peers follow this version")
    if (wire := assignment.get("wire")) is not None:
        lines.append(f"wire: {WireFormat.from_dict(wire).describe()}")
    if (state := assignment.get("training_state")) is not None:
        lines.append(training_state_line(state))
    return Group(grid, *lines)


def training_state_line(state: dict[str, Any]) -> str:
    """Step, last complete checkpoint, replicas per stage (training / placed and present) and the members' state."""
    every = f" (every {state['checkpoint_every']} steps)" if state["checkpoint_every"] else ""
    checkpoint = f"step {state['last_checkpoint']}" if state["last_checkpoint"] is not None else "none"
    replicas = ", ".join(f"{t}/{n}" for t, n in zip(state["replicas_training"], state["replicas"]))
    origins = _state_origins(state["handoffs"])
    resumed = "; resumed from checkpoints" if state["resumed_from_checkpoint"] else ""
    lost = f"; layers {state['seeded_layers']} restarted from the seed" if state["seeded_layers"] else ""
    return (f"step {state['step'] if state['step'] is not None else '-'} · last checkpoint: {checkpoint}{every} · "
            f"replicas training per stage: {replicas}{f' · state: {origins}' if origins else ''}{resumed}{lost}")


_ORIGINS = {"seed": "from the seed", "kept": "kept", "handed off": "handed off", "checkpoint": "from checkpoints"}


def _state_origins(handoffs: list[dict[str, Any]]) -> str:
    """E.g. "2 kept, 1 handed off 2.0 MiB in 0.5 s to …abc123": members by where their state came from; for those
    that downloaded it, the bytes in all, the slowest one's seconds (they download at once) and who."""
    parts = []
    for origin, label in _ORIGINS.items():
        if not (members := [h for h in handoffs if h["origin"] == origin]):
            continue
        part = f"{len(members)} {label}"
        if origin in ("handed off", "checkpoint"):
            who = ", ".join(shown(h["name"] or short_id(h["peer_id"])) for h in members)
            part += (f" {_size(sum(h['bytes'] for h in members))} in {max(h['seconds'] for h in members):.1f} s "
                     f"to {who}")
        parts.append(part)
    return ", ".join(parts)


def _size(n_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"


def progress_table(snapshot: dict[str, Any]) -> Table:
    """Each training peer's latest step; step time = compute + waiting, beside the plan's prediction."""
    names = {p["peer_id"]: shown(p["name"] or p["short_id"]) for p in snapshot["peers"]}
    assignment = snapshot.get("assignment")
    predicted = f", predicted {assignment['predicted_step_s']:.2f} s/step" if assignment else ""
    table = Table(title=f"training progress{predicted}")
    held_out = assignment.get("held_out") if assignment else None
    if held_out is not None:
        table.caption = held_out["text"]
    for column in ("peer", "plan", "step", "loss", "held-out", "tokens/s", "compute s", "wait s", "step s"):
        table.add_column(column, justify="left" if column in ("peer", "plan") else "right")
    for p in sorted(snapshot["progress"], key=lambda p: names.get(p["peer_id"], p["peer_id"])):
        loss = "" if p["loss"] is None else f"{p['loss']:.3f}"
        table.add_row(names.get(p["peer_id"], short_id(p["peer_id"])), f"v{p['assignment_version']}", str(p["step"]),
                      loss, _held_out_cell(p.get("held_out_loss"), p.get("held_out_step")), f"{p['tokens_per_s']:.0f}",
                      f"{p['compute_s']:.2f}", f"{p['wait_s']:.2f}", f"{p['compute_s'] + p['wait_s']:.2f}")
    return table


def _held_out_cell(loss: float | None, step: int | None) -> str:
    """A peer's newest held-out loss and the step it was measured after."""
    return "" if loss is None else f"{loss:.3f} @{step}"


def render(snapshot: dict[str, Any]) -> Group:
    parts = [peers_table(snapshot), links_table(snapshot)]
    if snapshot.get("assignment") is not None:
        parts.append(assignment_table(snapshot["assignment"]))
        if snapshot.get("pinned_coordinator") is None:
            parts.append(_unpinned_line(snapshot))
    if snapshot["progress"]:
        parts.append(progress_table(snapshot))
    parts.extend(judged_line("refused", peer) for peer in snapshot.get("refused", []))
    parts.extend(judged_line("flagged", peer) for peer in snapshot.get("flagged", []))
    return Group(*parts)


def _unpinned_line(snapshot: dict[str, Any]) -> str:
    """Whose plan an unpinned monitor shows: anyone can sign one, so the watcher is told, and how to choose."""
    signers = len(snapshot.get("assignments", {}))
    return (f"[yellow]plan shown: the newest of {signers} signer{'s' * (signers != 1)}' plans, signed by "
            f"{snapshot['assignment']['coordinator_id']}; pass --coordinator to watch only your coordinator's[/yellow]")


def judged_line(kind: str, peer: dict[str, Any]) -> str:
    """A peer the coordinator does not plan (refused) or prices by what it does (flagged), and why."""
    return f"[red]{kind}[/red] {shown(peer['name'] or peer['short_id'])} ({peer['peer_id']}): {shown(peer['reason'])}"


def render_watch(watch: DemoWatch) -> Group:
    """The live view: what the swarm is doing, and one row per client."""
    measured, pairs = watch.measured
    phase = watch.phases[-1] if watch.phases else None
    header = f"[bold]{watch.status}[/bold] — {len(watch.peers)} peers, {measured}/{pairs} links measured"
    if phase is not None:
        header += (f"; plan v{phase.version} ({phase.placement}, {phase.wire}) predicted "
                   f"{phase.predicted_step_s:.2f} s/step")
    table = Table()
    for column in ("client", "site", "stage·pipeline", "state", "step", "loss", "held-out", "tokens/s", "compute s",
                   "wait s"):
        table.add_column(column, justify="left" if column in ("client", "site", "state") else "right")
    roles = watch.assignment.roles if watch.assignment else {}
    for peer, record in sorted(watch.peers.items(), key=lambda item: item[1].public_name or item[0]):
        p = watch.latest.get(peer)
        role = roles.get(peer)
        table.add_row(shown(record.public_name or short_id(peer)), shown(record.site),
                      f"{role.stage}·{role.replica}" if role else "—",
                      record.state, str(p.step) if p else "", f"{p.loss:.3f}" if p and p.loss is not None else "",
                      _held_out_cell(p.held_out_loss, p.held_out_step) if p else "",
                      f"{p.tokens_per_s:.0f}" if p else "", f"{p.compute_s:.2f}" if p else "",
                      f"{p.wait_s:.2f}" if p else "")
    return Group(header, table)


def summary_lines(phases: list[PhaseResult]) -> list[str]:
    """The demo's closing lines: the loss curve, measured vs predicted step time, and the speed-up."""
    lines = []
    first = phases[0]
    if first.losses:
        steps = sorted(first.losses)
        took = first.loss_times.get(steps[-1], 0.0) - first.loss_times.get(steps[0], 0.0)
        lines.append(f"Loss ({first.placement} plan): {first.losses[steps[0]]:.3f} at step {steps[0]} → "
                     f"{first.losses[steps[-1]]:.3f} at step {steps[-1]}, {took:.1f} s later")
    if first.held_out:
        steps = sorted(first.held_out)
        lines.append(f"Held-out loss ({first.placement} plan): {first.held_out[steps[0]]:.3f} after step "
                     f"{steps[0]} → {first.held_out[steps[-1]]:.3f} after step {steps[-1]}")
    if first.sample is not None:
        lines.append(f"Sample of the {first.placement} plan's model at step {first.sample_step} (greedy; `hetswarm "
                     f"generate {first.exported}` samples more): {SAMPLE_PROMPT + first.sample!r}")
    for phase in phases:
        measured = "n/a" if phase.measured_step_s is None else f"{phase.measured_step_s:.2f} s"
        error = "" if phase.error is None else f" ({phase.error:+.0%} vs predicted)"
        lines.append(f"{phase.placement.capitalize()} plan ({phase.wire} on the wire): measured {measured}/step, "
                     f"predicted {phase.predicted_step_s:.2f} s/step{error}; compute {phase.compute_s or 0:.2f} s, "
                     f"waiting {phase.wait_s or 0:.2f} s per step")
    if len(phases) > 1 and all(p.measured_step_s for p in phases):
        for other in phases[1:]:
            lines.append(f"Speed-up of the {first.placement} plan over the {other.placement} plan: "
                         f"{other.measured_step_s / first.measured_step_s:.2f}× measured, "
                         f"{other.predicted_step_s / first.predicted_step_s:.2f}× predicted")
    return lines
