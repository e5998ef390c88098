"""A peer's part in a plan, read once from the assignment (protocol/stage_role.py): what its stage is built from."""
from __future__ import annotations

import pytest

from hetswarm.protocol.stage_role import StageRole
from tests.helpers.plans import plan
from tests.helpers.swarm_records import IDS


def test_each_member_reads_its_neighbours_group_and_layers_from_the_plan():
    assignment = plan(version=7, step=5, d_dp=2, d_pp=2)
    for peer, placed in assignment.roles.items():
        role = StageRole.of(assignment, peer)
        chain = assignment.pipelines[placed.replica]
        assert (role.stage, role.pipeline, role.version, role.first_step) == (placed.stage, placed.replica, 7, 5)
        assert role.neighbours == ((chain[0], None) if placed.stage == 1 else (None, chain[1]))
        assert role.group == tuple(other[placed.stage] for other in assignment.pipelines)
        assert role.layers == tuple(assignment.stage_layers[placed.stage]) and (role.d_pp, role.d_dp) == (2, 2)
        assert set(role.members) == set(assignment.roles) and len(role.members) == 4
        assert set(role.tied_holders) == set(assignment.roles)  # two stages: every peer holds an end
        assert role.model == assignment.model_config() and role.wire == assignment.wire_format()


def test_a_peer_without_a_role_has_no_stage_role():
    assignment = plan(version=7)
    stranger = next(peer for peer in IDS if peer not in assignment.roles)
    with pytest.raises(ValueError, match="has no role in assignment version 7"):
        StageRole.of(assignment, stranger)
