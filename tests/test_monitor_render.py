"""The monitor's human view shows what the JSON snapshot holds, training progress included."""
from __future__ import annotations

from rich.console import Console

from hetswarm.client.cli.render import render, training_state_line
from hetswarm.client.peer.snapshot import SwarmSnapshot
from hetswarm.protocol.records import CheckpointInfo, CheckpointPlan, Progress
from tests.helpers.swarm_records import IDS, record
from tests.test_training_correctness import _assignment

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


def test_the_assignment_shows_the_step_the_last_complete_checkpoint_and_the_replicas_per_stage():
    """A 2 × 2 plan: checkpoints cover both stages at step 8 and only stage 0 at step 12; one member took its state
    from peers, one replica of stage 1 is gone."""
    a, b, c, d = IDS[:4]
    assignment = _assignment([[a, b], [c, d]], IDS[9]).copy(update={"version": 3, "checkpoints": CheckpointPlan(
        savers=[a, b], every=4)})
    held = {a: [(12, [0, 2]), (8, [0, 2])], b: [(8, [2, 4])]}
    records = {peer: record(peer).copy(update={"checkpoints": [CheckpointInfo(step=s, layers=l) for s, l in
                                                               held.get(peer, [])]}) for peer in (a, b, c)}
    progress = {peer: Progress(peer_id=peer, assignment_version=3, step=step, loss=None, tokens_per_s=1.0,
                               compute_s=0.1, wait_s=0.1, state_origin=origin, handoff_bytes=size, handoff_s=0.5,
                               updated_at=0.0)
                for peer, step, origin, size in ((a, 14, "kept", 0), (b, 14, "kept", 0), (c, 13, "handed off", 2**21))}
    snap = SwarmSnapshot(swarm="s", peers=records, assignments={IDS[9]: assignment}, progress=progress, read_at=0.0)
    state = snap.to_json(IDS[9])["assignment"]["training_state"]
    assert state["step"] == 14 and state["last_checkpoint"] == 8 and state["checkpoints_by_stage"] == [12, 8]
    assert state["replicas"] == [2, 1] and state["replicas_training"] == [2, 1]  # d is gone
    assert state["handoffs"][2] == {"peer_id": c, "name": None, "origin": "handed off", "bytes": 2**21, "seconds": 0.5}
    line = training_state_line(state)
    assert "step 14 · last checkpoint: step 8 (every 4 steps)" in line and "per stage: 2/2, 1/1" in line
    assert "1 took their state from peers (2.0 MiB" in line
