"""A plan has one price: the coordinator's, published with it, for the bytes the plan's wire sends; the monitor shows
that price and does not price the plan again (coordinator/assignment_record.py, client/monitor/snapshot.py)."""
from __future__ import annotations

import pydantic.v1 as pydantic
import pytest

from hetswarm.client.monitor.snapshot import SwarmSnapshot
from hetswarm.coordinator.assignment_record import build_assignment
from hetswarm.coordinator.planner import deployed
from hetswarm.coordinator.swarm_view import build_view
from hetswarm.protocol.records import Assignment, BottleneckHop
from hetswarm.protocol.wire_format import WireFormat
from tests.helpers.plans import COORDINATOR, MODEL, worldwide_records
from tests.helpers.swarm_records import IDS

FULL = WireFormat(activations="fp32", gradients="fp32", allreduce="fp32")
EIGHT_BIT = WireFormat(activations="8bit", gradients="8bit", allreduce="fp32")
PIPELINES = [[IDS[0], IDS[3], IDS[5]], [IDS[1], IDS[4], IDS[6]]]  # Oregon→Tokyo→London, Virginia→Seoul→Frankfurt


def _published(wire: WireFormat) -> Assignment:
    proposal = deployed(build_view(worldwide_records(8)), PIPELINES, MODEL, [wire])
    return build_assignment(proposal, coordinator_id=COORDINATOR, version=1, reason="test", step=0)


def test_the_published_bottleneck_is_the_slowest_hop_for_the_bytes_the_wire_sends():
    full, eight = _published(FULL), _published(EIGHT_BIT)
    for assignment in (full, eight):
        hop = assignment.bottleneck
        assert hop is not None and hop.stage < 2 and hop.pipeline < 2 and not hop.estimated
        assert hop.micro_batch_s > hop.latency_ms / 1000
    # the same placement, the same links: 8-bit frames carry about a quarter of fp32's bytes across the same hop
    assert (full.bottleneck.stage, full.bottleneck.pipeline) == (eight.bottleneck.stage, eight.bottleneck.pipeline)
    transfer = [a.bottleneck.micro_batch_s - a.bottleneck.latency_ms / 1000 for a in (full, eight)]
    assert 0.2 < transfer[1] / transfer[0] < 0.3, transfer
    assert full.predicted_step_s > eight.predicted_step_s


def test_the_monitor_shows_the_published_price_with_the_hops_ends():
    assignment = _published(EIGHT_BIT)
    records = worldwide_records(8)
    shown = SwarmSnapshot(swarm="s", peers=records, assignments={COORDINATOR: assignment}, progress={},
                          read_at=0.0).to_json(COORDINATOR)["assignment"]
    hop, link = assignment.bottleneck, shown["bottleneck_link"]
    chain = PIPELINES[hop.pipeline]
    assert link == hop.dict() | {"src": link["src"], "dst": link["dst"]}
    assert (link["src"]["peer_id"], link["dst"]["peer_id"]) == (chain[hop.stage], chain[hop.stage + 1])
    assert shown["predicted_step_s"] == assignment.predicted_step_s


def test_a_bottleneck_that_is_not_a_hop_of_the_plan_is_refused():
    assignment = _published(FULL)
    fields = assignment.dict()
    for stage, pipeline in ((2, 0), (0, 2)):
        fields["bottleneck"] = BottleneckHop(stage=stage, pipeline=pipeline, latency_ms=1.0, bandwidth_mbps=1.0,
                                             estimated=False, micro_batch_s=0.1).dict()
        with pytest.raises(pydantic.ValidationError, match="is not a hop of a 2×3 plan"):
            Assignment.parse_obj(fields)


def test_a_per_link_wire_is_priced_hop_by_hop_and_published_as_chosen():
    """Pipeline 0's hops in fp32, pipeline 1's in 8-bit: each hop is priced for its own codec's bytes, and the record
    carries the codecs to the stages as chosen."""
    per_link = WireFormat(activations="8bit", gradients="8bit", allreduce="fp32", hops=(("fp32", "8bit"),) * 2,
                          groups=("fp32", "8bit", "fp32"))
    full, mixed = (deployed(build_view(worldwide_records(8)), PIPELINES, MODEL, [wire]) for wire in (FULL, per_link))
    full_hops, mixed_hops = (p.plan.micro_batch_hops_s(p.execution.micro_batches) for p in (full, mixed))
    assert (mixed_hops[:, 0] == full_hops[:, 0]).all() and (mixed_hops[:, 1] < full_hops[:, 1]).all()
    assert mixed.plan.stage_allreduce_s[1] < full.plan.stage_allreduce_s[1]
    assert (mixed.plan.stage_allreduce_s[[0, 2]] == full.plan.stage_allreduce_s[[0, 2]]).all()
    published = _published(per_link)
    assert Assignment.parse_obj(published.dict()).wire_format() == per_link


@pytest.mark.parametrize("change", [{"hops": [["fp32", "8bit"]]}, {"hops": [["fp32"], ["8bit"]]},
                                    {"groups": ["fp32", "8bit"]}, {"groups": ["fp32", "4bit", "8bit"]},
                                    {"hops": [["fp32", "8bit"], "8bit"]}, {"unknown": "8bit"}],
                         ids=["too-few-boundaries", "too-few-pipelines", "too-few-groups", "delta-codec-whole",
                              "ragged", "unknown-field"])
def test_a_wire_whose_codecs_do_not_fit_the_plan_is_refused(change):
    fields = _published(FULL).dict()
    fields["wire"] = fields["wire"] | change
    with pytest.raises(pydantic.ValidationError, match="wire|hops|groups"):
        Assignment.parse_obj(fields)
