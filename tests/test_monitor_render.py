"""The monitor's human view shows what the JSON snapshot holds, training progress included."""
from __future__ import annotations

from rich.console import Console

from hetswarm.client.monitor.render import render, training_state_line
from hetswarm.client.monitor.snapshot import SwarmSnapshot
from hetswarm.coordinator.link_estimate import describe_error
from hetswarm.protocol.keys import short_id
from hetswarm.protocol.records import CheckpointInfo, CheckpointPlan, Handoff, PeerRecord, Progress, Refusals
from hetswarm.protocol.wire_format import WireFormat
from tests.helpers.swarm_records import IDS, link, record
from tests.helpers.tiny_training import assignment_for

PEER = "QmYmMBM4vh9eoAh1EwnRNM9EpFJBgvXviz4LGTDycLc9cT"


def snapshot(progress: list[dict]) -> dict:
    peer = {"peer_id": PEER, "short_id": "…cLc9cT", "name": "tokyo-1", "site": "Tokyo", "device": "cpu",
            "device_name": "test cpu", "tflops": 0.02, "dtype": "float32", "memory_gib": 8.0, "state": "training",
            "last_heard_s": 1.0, "version": "0.1.0", "assignment_version": 3, "role": {"stage": 1, "replica": 0}}
    return {"swarm": "s", "peers": [peer], "links": [], "estimated_links": [], "assignment": None,
            "counts": {"peers": 1, "by_state": {"training": 1}, "pairs": 0, "pairs_measured": 0},
            "progress": progress}


def printed(snap: dict) -> str:
    console = Console(width=200, record=True)
    console.print(render(snap))
    return console.export_text()


def test_progress_rows_show_step_loss_and_step_time():
    text = printed(snapshot([{"peer_id": PEER, "assignment_version": 3, "step": 17, "loss": 4.25, "tokens_per_s": 300.0,
                              "compute_s": 0.25, "wait_s": 1.0, "updated_at": 0.0}]))
    assert "training progress" in text and "tokens/s" in text
    row = next(line for line in text.splitlines() if "tokyo-1" in line and "17" in line)
    assert "v3" in row and "4.250" in row and "1.25" in row
    assert "stage 1, replica 0" in text


def test_no_progress_table_before_training():
    assert "training progress" not in printed(snapshot([]))


def _progress(peer: str, step: int, **fields) -> Progress:
    return Progress(peer_id=peer, assignment_version=3, step=step, loss=None, tokens_per_s=1.0, compute_s=0.1,
                    wait_s=0.1, updated_at=0.0, **fields)


def _with_checkpoints(peer: str, held: list[tuple[int, list[int]]], state: str = "training") -> PeerRecord:
    return record(peer, state=state).copy(update={"checkpoints": [CheckpointInfo(step=s, layers=l) for s, l in held]})


def test_the_assignment_shows_the_step_the_last_complete_checkpoint_and_the_replicas_per_stage():
    """A 2 × 2 plan: checkpoints cover both stages at step 8 and only stage 0 at step 12 (the leaving peer's stage 1
    checkpoint of step 12 does not count); one member took its state from peers; one replica of stage 1 is leaving."""
    a, b, c, d = IDS[:4]
    assignment = assignment_for([[a, b], [c, d]], IDS[9]).copy(update={"version": 3, "checkpoints": CheckpointPlan(
        savers=[a, b], every=4)})
    records = {a: _with_checkpoints(a, [(12, [0, 2]), (8, [0, 2])]), b: _with_checkpoints(b, [(8, [2, 4])]),
               c: _with_checkpoints(c, []), d: _with_checkpoints(d, [(12, [2, 4])], state="leaving")}
    progress = {a: _progress(a, 14, state_origin="kept"), b: _progress(b, 14, state_origin="kept"),
                c: _progress(c, 13, state_origin="handed off", handoff_bytes=2**21, handoff_s=0.5),
                d: _progress(d, 14, state_origin="kept")}
    snap = SwarmSnapshot(swarm="s", peers=records, assignments={IDS[9]: assignment}, progress=progress, read_at=0.0)
    json_snapshot = snap.to_json(IDS[9])
    state = json_snapshot["assignment"]["training_state"]
    assert state["step"] == 14 and state["last_checkpoint"] == 8 and state["checkpoints_by_stage"] == [12, 8]
    assert state["replicas"] == [2, 1] and state["replicas_training"] == [2, 1]  # d is leaving
    assert state["checkpoint_savers"] == [a, b] and state["checkpoint_every"] == 4
    assert state["resumed_from_checkpoint"] is False and state["seeded_layers"] == []
    assert state["handoffs"][2] == {"peer_id": c, "name": None, "origin": "handed off", "bytes": 2**21, "seconds": 0.5}
    text = " ".join(printed(json_snapshot).split())  # the live view, its wrapped lines joined
    assert "step 14 · last checkpoint: step 8 (every 4 steps)" in text and "per stage: 2/2, 1/1" in text
    assert f"state: 3 kept, 1 handed off 2.0 MiB in 0.5 s to {short_id(c)}" in text


def test_a_resume_shows_where_the_state_came_from_and_the_seeded_layers():
    """A plan resumed from checkpoints with layers [2, 4) lost, and no checkpoint plan: no saver for any stage."""
    a, b, c, d = IDS[:4]
    handoff = Handoff(sources=[a], seeded_layers=[[2, 4]], resumed_from_checkpoint=True)
    assignment = assignment_for([[a, b], [c, d]], IDS[9]).copy(update={"version": 3, "handoff": handoff})
    records = {peer: record(peer, state="training") for peer in (a, b, c, d)}
    progress = {a: _progress(a, 3, state_origin="checkpoint", handoff_bytes=3 * 2**10, handoff_s=1.5),
                b: _progress(b, 5, state_origin="seed", health="retrying", reason="test"),
                c: _progress(c, 3, state_origin="kept"), d: _progress(IDS[4], 9)}  # d's slot: signed by another
    snap = SwarmSnapshot(swarm="s", peers=records, assignments={IDS[9]: assignment}, progress=progress, read_at=0.0)
    state = snap.to_json(IDS[9])["assignment"]["training_state"]
    assert state["step"] == 3 and state["replicas"] == [2, 2] and state["replicas_training"] == [2, 0]
    assert state["last_checkpoint"] is None and state["checkpoints_by_stage"] == [None, None]
    assert state["checkpoint_savers"] == [None, None] and state["checkpoint_every"] is None
    assert state["resumed_from_checkpoint"] is True and state["seeded_layers"] == [[2, 4]]
    assert [h["origin"] for h in state["handoffs"]] == ["checkpoint", "seed", "kept"]
    line = training_state_line(state)
    assert line.startswith("step 3 · last checkpoint: none · replicas training per stage: 2/2, 0/2")
    assert f"state: 1 from the seed, 1 kept, 1 from checkpoints 3.0 KiB in 1.5 s to {short_id(a)}" in line
    assert line.endswith("; resumed from checkpoints; layers [[2, 4]] restarted from the seed")


def test_the_coordinators_refused_and_flagged_peers_are_shown_with_their_reasons():
    a, b, c, d, intruder = IDS[:5]
    assignment = assignment_for([[a, b], [c, d]], IDS[9]).copy(update={"version": 3})
    records = {peer: record(peer, state="training") for peer in (a, b, c, d)} | {intruder: record(intruder)}
    refusals = Refusals(coordinator_id=IDS[9], refused={intruder: "not admitted: no join token"},
                        flagged={a: "claims 100 TFLOPS but computes like 1"}, updated_at=0.0)
    forged = Refusals(coordinator_id=IDS[8], refused={a: "forged by someone else"}, updated_at=0.0)
    snap = SwarmSnapshot(swarm="s", peers=records, assignments={IDS[9]: assignment}, progress={}, read_at=0.0,
                         refusals={IDS[9]: refusals, IDS[8]: forged})
    shown = snap.to_json()  # unpinned: the judge is the coordinator of the assignment shown
    assert [(r["peer_id"], r["reason"]) for r in shown["refused"]] == [(intruder, "not admitted: no join token")]
    assert [r["peer_id"] for r in shown["flagged"]] == [a]
    text = printed(shown)
    assert f"refused {short_id(intruder)} ({intruder}): not admitted: no join token" in text
    assert "flagged" in text and "claims 100 TFLOPS" in text and "forged" not in text


def test_the_plans_wire_is_shown():
    a, b, c, d = IDS[:4]
    wire = WireFormat(activations="8bit", gradients="fp16", allreduce="8bit", activation_deltas="4bit")
    assignment = assignment_for([[a, b], [c, d]], IDS[9], wire).copy(update={"version": 3})
    records = {peer: record(peer, state="training") for peer in (a, b, c, d)}
    snap = SwarmSnapshot(swarm="s", peers=records, assignments={IDS[9]: assignment}, progress={}, read_at=0.0)
    shown = snap.to_json()
    assert shown["assignment"]["wire"] == {"activations": "8bit", "gradients": "fp16", "allreduce": "8bit",
                                           "activation_deltas": "4bit", "allreduce_density": None}
    assert ("wire: 8bit activations, fp16 activation gradients, 8bit all-reduce, 4bit activation deltas"
            in printed(shown))


def test_each_last_stage_shows_its_held_out_loss_and_the_table_what_the_pipelines_agree_on():
    a, b, c, d = IDS[:4]
    assignment = assignment_for([[a, b], [c, d]], IDS[9], eval_every=5).copy(update={"version": 3})
    progress = {a: _progress(a, 10), c: _progress(c, 10),
                b: _progress(b, 10, held_out_step=9, held_out_loss=2.5),
                d: _progress(d, 10, held_out_step=9, held_out_loss=2.5)}
    snap = SwarmSnapshot(swarm="s", peers={p: record(p, state="training") for p in (a, b, c, d)},
                         assignments={IDS[9]: assignment}, progress=progress, read_at=0.0)
    json_snapshot = snap.to_json(IDS[9])
    held_out = json_snapshot["assignment"]["held_out"]
    assert {key: held_out[key] for key in ("step", "loss", "agreeing", "reported", "corroborated")} == {
        "step": 9, "loss": 2.5, "agreeing": 2, "reported": 2, "corroborated": True}
    text = printed(json_snapshot)
    assert "held-out loss 2.500 after step 9 (2 of 2 pipelines agree)" in " ".join(text.split())
    rows = [line for line in text.splitlines() if "2.500 @9" in line]
    assert len(rows) == 2  # the two last stages; the first stages measure nothing


def test_a_peers_own_words_cannot_break_or_restyle_the_view():
    """Markup in a public name used to crash the monitor; terminal escapes would have reached the terminal."""
    hostile = {"name": "[/x][bold red]boss", "site": "\x1b[2JParis", "device_name": "gpu\x07[/]"}
    snap = snapshot([])
    snap["peers"][0].update(hostile)
    snap["refused"] = [{"peer_id": PEER, "short_id": "…cLc9cT", "name": hostile["name"], "reason": "[/] \x1b[31m"}]
    text = printed(snap)
    assert "[/x][bold red]boss" in text and "?[2JParis" in text and "gpu?[/]" in text and "[/] ?[31m" in text
    assert "\x1b" not in text and "\x07" not in text


def test_an_unpinned_monitor_says_whose_plan_it_shows_and_a_pinned_one_does_not():
    a, b, c, d = IDS[:4]
    records = {peer: record(peer, state="training") for peer in (a, b, c, d)}
    ours = assignment_for([[a, b], [c, d]], IDS[9]).copy(update={"version": 3})
    theirs = assignment_for([[a, b], [c, d]], IDS[8]).copy(update={"version": 900})  # anyone can sign a newer one
    snap = SwarmSnapshot(swarm="s", peers=records, assignments={IDS[9]: ours, IDS[8]: theirs}, progress={},
                         read_at=0.0, refusals={})
    unpinned = printed(snap.to_json())
    assert f"the newest of 2 signers' plans, signed by {IDS[8]}" in unpinned and "--coordinator" in unpinned
    pinned = printed(snap.to_json(coordinator=IDS[9]))
    assert "assignment v3" in pinned and "signers' plans" not in pinned


def test_estimated_links_are_marked_and_their_error_stated():
    """Three peers, two links measured: the third pair is estimated, and the error is stated as unknown."""
    a, b, c = IDS[:3]
    records = {a: record(a, links={b: link(10, 100), c: link(30, 50)}), b: record(b), c: record(c)}
    json_snapshot = SwarmSnapshot(swarm="s", peers=records, assignments={}, progress={}, read_at=0.0).to_json(None)
    assert [(e["src"], e["dst"], e["method"]) for e in json_snapshot["estimated_links"]] == [(b, c, "model")]
    assert json_snapshot["estimate_error"] == describe_error(None)
    text = printed(json_snapshot)
    assert "2 of 3 pairs measured; ~ estimated, error unknown" in " ".join(text.split())  # the title wraps
    assert f"~{json_snapshot['estimated_links'][0]['latency_ms']:.0f} /" in text
