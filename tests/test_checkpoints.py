"""Checkpoints on disk (client/training/checkpoints.py): whole or absent, checked on load, the newest kept, written
in the background one at a time."""
from __future__ import annotations

import asyncio
import time

import pytest
import torch

from hetswarm.client.training import checkpoints as checkpoints_module
from hetswarm.client.training.checkpoints import CheckpointDir, CheckpointWriter
from hetswarm.client.training.model import build_stage
from hetswarm.client.training.stage_state import StageState, units_of_layers
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.records import CheckpointInfo
from tests.helpers.tiny_training import checkpoint_root

TINY = get_model_config("tiny")
LAST = (2, 4)


def state_at(step: int) -> StageState:
    stage = build_stage(TINY, 1, 2, seed=step)
    return StageState.capture(stage, StageConfig().build_optimizer(stage.parameters()), step=step)


def test_a_saved_checkpoint_is_found_whole_and_only_the_newest_are_kept(tmp_path):
    folder = CheckpointDir(tmp_path, "swarm", keep=2)
    for step in (4, 8, 12):
        folder.save(state_at(step), layers=LAST, model=TINY, plan_version=3)
    assert [meta.step for meta in folder.list()] == [12, 8]
    assert not list(tmp_path.rglob("*.partial")) and len(list(tmp_path.rglob("*.state"))) == 2
    found = folder.find_part(12, units_of_layers(LAST, TINY.n_layers))
    assert found is not None and found.step == 12
    for name, tensor in state_at(12).tensors.items():
        assert torch.equal(found.tensors[name], tensor), name
    assert folder.find_part(4, ["head"]) is None and folder.find_part(12, ["embed"]) is None
    assert folder.infos() == [
        CheckpointInfo(step=12, layers=[2, 4], plan_version=3, root=checkpoint_root(state_at(12))),
        CheckpointInfo(step=8, layers=[2, 4], plan_version=3, root=checkpoint_root(state_at(8)))]


def test_a_corrupt_or_half_written_checkpoint_is_skipped(tmp_path, caplog):
    folder = CheckpointDir(tmp_path, "swarm")
    meta = folder.save(state_at(8), layers=LAST, model=TINY, plan_version=1)
    data = bytearray(meta.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    meta.path.write_bytes(bytes(data))
    assert folder.find_part(8, ["head"]) is None and "does not match its SHA-256" in caplog.text
    (folder.folder / "layers-2-4-step-9.json").write_text("{not json")
    assert [m.step for m in folder.list()] == [8] and "Skipped the checkpoint" in caplog.text


def test_a_state_of_other_layers_is_not_saved_as_these(tmp_path):
    with pytest.raises(ValueError, match="not the units"):
        CheckpointDir(tmp_path, "swarm").save(state_at(4), layers=(0, 2), model=TINY, plan_version=1)


def test_the_writer_writes_in_the_background_and_skips_a_checkpoint_while_one_is_written(tmp_path, monkeypatch):
    folder = CheckpointDir(tmp_path, "swarm")
    save = CheckpointDir.save

    def slow_save(self, *args, **kwargs):
        time.sleep(0.5)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(checkpoints_module.CheckpointDir, "save", slow_save)

    async def write_two() -> CheckpointWriter:
        writer = CheckpointWriter(folder)
        writer.submit(state_at(4), layers=LAST, model=TINY, plan_version=1)
        writer.submit(state_at(8), layers=LAST, model=TINY, plan_version=1)  # the first is still being written
        await writer.close()
        return writer

    writer = asyncio.run(write_two())
    assert writer.last is not None and writer.last.step == 4
    assert [meta.step for meta in folder.list()] == [4]
