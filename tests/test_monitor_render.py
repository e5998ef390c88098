"""The monitor's human view shows what the JSON snapshot holds, training progress included."""
from __future__ import annotations

from rich.console import Console

from hetswarm.client.cli.render import render

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
