"""Which exports of the coordinator (--export-every) are there, and which one is due next, after a restart too.

The export itself runs on a live swarm in tests/test_state_survives.py (it equals the checkpoints' export)."""
from pathlib import Path

from hetswarm.client.training.periodic_export import PeriodicExport, exported_steps


def test_only_complete_exports_count_and_a_restarted_coordinator_goes_on_after_the_newest(tmp_path: Path):
    for name in ("step-16", "step-8", ".step-24.partial", "notes"):
        (tmp_path / name).mkdir()
    assert exported_steps(tmp_path) == [8, 16]
    assert exported_steps(tmp_path / "absent") == []

    def export_at(every: int, folder: Path) -> PeriodicExport:
        return PeriodicExport(dht=None, swarm="s", every=every, folder=folder, current=lambda: (None, 0))

    assert export_at(8, tmp_path).due == 24  # the partial step-24 does not count
    assert export_at(5, tmp_path).due == 20
    assert export_at(8, tmp_path / "absent").due == 8
