"""The live cost model against a step time worked out by hand on a four-device, two-stage plan."""
from __future__ import annotations

import numpy as np
import pytest

from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.live_cost import Execution, NoFeasiblePlan, predict_step_s, stage_memory_bytes
from hetswarm.coordinator.scheduling.plan import cost_plan
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.network import Network

# 2 layers of d=4: 12·16 + 13·4 = 244 params each; embedding (8 + 4)·4 = 48 on stage 0, head 2·4 + 4·8 = 40 on stage 1.
MODEL = ModelConfig(name="hand", n_layers=2, d_model=4, n_heads=1, seq_len=4, vocab_size=8, batch_tokens=8,
                    micro_batches=2)
GRID = np.array([[0, 1], [2, 3]])  # stage 0 on devices 0, 1; stage 1 on devices 2, 3
TFLOPS = np.array([2e-9, 1e-9, 4e-9, 4e-9])  # 1e-9 TFLOPS = 1,000 FLOP/s
ROOMY_GIB = np.full(4, 1.0)


def plan_on_uniform_network():
    network = Network.from_matrices(np.full((4, 4), 10.0), np.full((4, 4), 1.0))  # 10 ms, 1 Gbit/s everywhere
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=2), d_dp=2, d_pp=2)
    return cost_plan(paper, GRID)


def test_step_time_is_communication_plus_slowest_stage_plus_bubble():
    live = predict_step_s(plan_on_uniform_network(), MODEL, tflops=TFLOPS, memory_gib=ROOMY_GIB)
    # c_DP = 292 params · 4 B = 1168 B; DataP = 2·(0.010 + 8·1168e-9 / (2·1)) for the one other group member.
    assert live.data_parallel_s == pytest.approx(2 * (0.010 + 4.672e-6))
    # c_PP = 4 tokens per pipeline · 4 · 2 B = 32 B over the one boundary, 16 B per micro-batch; compute sets the
    # pace, so the hop adds one micro-batch's transfer forward and one backward.
    assert live.pipeline_parallel_s == pytest.approx(2 * (0.010 + 128e-9))
    # FLOPs per token: stage 0: 6·292 + 12·4·4 = 1944, stage 1: 6·284 + 192 = 1896; 4 tokens per pipeline.
    # Stage 0's slowest replica does 1e3 FLOP/s: 7.776 s; stage 1's does 4e3: 1.896 s.
    assert live.compute_s == pytest.approx(7.776)
    assert live.bubble_s == pytest.approx(1.896 / 2)  # GPipe: the other stage's one micro-batch of M = 2
    assert live.total_s == pytest.approx(0.020009344 + 0.020000256 + 7.776 + 0.948)
    assert live.to_dict()["step_s"] == pytest.approx(live.total_s)


def test_a_stage_groups_allreduce_takes_its_slowest_pair_not_a_members_sum_of_sends():
    latency = np.full((4, 4), 10.0)
    latency[0, 1] = latency[1, 0] = 30.0
    network = Network.from_matrices(latency, np.full((4, 4), 1.0))
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=4, d_pp=1), d_dp=4, d_pp=1)
    # c_DP = (2·244 + 48 + 40) params · 4 B = 2304 B, a quarter of it to each peer and back: 2·(α + 8·2304e-9 / 4).
    shard_s = 8 * 2304e-9 / 4
    assert paper.concurrent_allreduce_s(np.array([[0, 1, 2, 3]]))[0] == pytest.approx(2 * (0.030 + shard_s))
    assert paper.member_times_s(np.array([[0, 1, 2, 3]]))[0, 0] == pytest.approx(2 * (0.050 + 3 * shard_s))


@pytest.mark.parametrize("slow_stage, data_parallel_s", [
    (0, 2 * (4.0 + 4.672e-6)),  # nothing hides the first stage's all-reduce
    (1, 2 * (4.0 + 4.672e-6) - 2 / 3 * 7.776 / 2),  # stage 0's backward of the last micro-batch hides part of it
])
def test_an_allreduce_runs_hidden_while_the_stages_before_it_finish_their_backward(slow_stage, data_parallel_s):
    latency = np.full((4, 4), 10.0)
    a, b = GRID[slow_stage]
    latency[a, b] = latency[b, a] = 4000.0
    network = Network.from_matrices(latency, np.full((4, 4), 1.0))
    plan = cost_plan(PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=2), d_dp=2, d_pp=2), GRID)
    live = predict_step_s(plan, MODEL, tflops=TFLOPS, memory_gib=ROOMY_GIB)
    assert live.data_parallel_s == pytest.approx(data_parallel_s)
    assert live.compute_s == pytest.approx(7.776)  # the backward of stage 0 is 2/3 of it, split in M = 2


def test_pipelines_run_at_their_own_pace_until_the_allreduce():
    # Pipeline 0 is (slow, fast): 7.776 s then 1.896 s; pipeline 1 is (fast, slow): 1.944 s then 7.584 s. Neither
    # is as slow as a pipeline of both slow devices (7.776 + 7.584 / 2 of bubble).
    tflops = np.array([1e-9, 4e-9, 4e-9, 1e-9])
    live = predict_step_s(plan_on_uniform_network(), MODEL, tflops=tflops, memory_gib=ROOMY_GIB)
    # Pipeline 0 is the slower (7.776 + 1.896 / 2 against 7.584 + 1.944 / 2); stage 0's all-reduce starts at its end.
    assert live.compute_s == pytest.approx(7.776) and live.bubble_s == pytest.approx(0.948)
    assert live.data_parallel_s == pytest.approx(0.020009344)
    assert live.total_s == pytest.approx(0.020009344 + 0.020000256 + 7.776 + 0.948)
    slowest_per_stage = predict_step_s(plan_on_uniform_network(), MODEL, tflops=np.full(4, 1e-9), memory_gib=ROOMY_GIB)
    assert slowest_per_stage.bubble_s == pytest.approx(7.584 / 2)


def test_a_hop_slower_than_every_stage_paces_both_phases():
    bandwidth = np.full((4, 4), 1.0)
    bandwidth[1, 3] = bandwidth[3, 1] = 8 * 16e-9 / 9.99  # pipeline 1's hop: 0.010 + 9.99 = 10 s per micro-batch of 16 B
    network = Network.from_matrices(np.full((4, 4), 10.0), bandwidth)
    plan = cost_plan(PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=2), d_dp=2, d_pp=2), GRID)
    live = predict_step_s(plan, MODEL, tflops=TFLOPS, memory_gib=ROOMY_GIB)
    # Per micro-batch (M = 2): forward 7.776/6 = 1.296 and 1.896/6 = 0.316, backward twice that; the hop 10 s.
    forward = 1.296 + 0.316 + 10 + (2 - 1) * 10
    backward = 2.592 + 0.632 + 10 + (2 - 1) * 10
    assert live.compute_s == pytest.approx(7.776) and live.bubble_s == pytest.approx(0.948)
    assert live.pipeline_parallel_s == pytest.approx(forward + backward - 7.776 - 0.948)
    assert plan.breakdown.pipeline_parallel_s == pytest.approx(2 * (0.010 + 2 * 9.99))  # the paper's: whole batch


def test_each_pipeline_runs_over_its_own_hops():
    # Pipeline 0 (devices 0 → 2) has the fast stage 0 (3.888 s) but a 3 s hop; pipeline 1 (1 → 3) the slow stage 0
    # (7.776 s) and a 10 ms hop. Per micro-batch (M = 2), forward and backward:
    latency = np.full((4, 4), 10.0)
    latency[0, 2] = latency[2, 0] = 3000.0
    network = Network.from_matrices(latency, np.full((4, 4), 1.0))
    plan = cost_plan(PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=2), d_dp=2, d_pp=2), GRID)
    hop_s, slow_hop_s = 0.010 + 128e-9, 3.0 + 128e-9
    pipeline_0 = (0.648 + 0.316 + slow_hop_s + slow_hop_s) + (1.296 + 0.632 + slow_hop_s + slow_hop_s)
    pipeline_1 = (1.296 + 0.316 + hop_s + 1.296) + (2.592 + 0.632 + hop_s + 2.592)
    pipeline_1_slowest_hop = (1.296 + 0.316 + slow_hop_s + slow_hop_s) + (2.592 + 0.632 + slow_hop_s + slow_hop_s)
    own, bound = (predict_step_s(plan, MODEL, tflops=TFLOPS, memory_gib=ROOMY_GIB, slowest_hops=slowest)
                  for slowest in (False, True))
    assert pipeline_1 < pipeline_0 < pipeline_1_slowest_hop
    assert own.compute_s + own.bubble_s + own.pipeline_parallel_s == pytest.approx(pipeline_0)
    assert bound.compute_s + bound.bubble_s + bound.pipeline_parallel_s == pytest.approx(pipeline_1_slowest_hop)
    assert own.total_s < bound.total_s


def test_the_commit_vote_costs_the_plans_largest_latency():
    latency = np.full((4, 4), 10.0)
    latency[1, 3] = latency[3, 1] = 80.0  # two peers of the plan are far apart
    live = predict_step_s(plan_on_uniform_network(), MODEL, tflops=TFLOPS, memory_gib=ROOMY_GIB, latency_ms=latency)
    unpriced = predict_step_s(plan_on_uniform_network(), MODEL, tflops=TFLOPS, memory_gib=ROOMY_GIB)
    assert unpriced.commit_s == 0 and live.commit_s == pytest.approx(0.080)
    assert live.total_s == pytest.approx(unpriced.total_s + 0.080)


@pytest.mark.parametrize("vote_ms, commit_s", [(80.0, 0.0), (12_000.0, 12.0 - 7.68)])
def test_a_single_stage_votes_while_it_computes_the_next_step(vote_ms, commit_s):
    latency = np.full((4, 4), 10.0)
    latency[1, 3] = latency[3, 1] = vote_ms
    network = Network.from_matrices(latency, np.full((4, 4), 1.0))
    plan = cost_plan(PaperCostModel(network, Payloads.from_model(MODEL, d_dp=4, d_pp=1), d_dp=4, d_pp=1),
                     np.array([[0, 1, 2, 3]]))
    live = predict_step_s(plan, MODEL, tflops=TFLOPS, memory_gib=ROOMY_GIB, latency_ms=latency)
    # Whole model (1944 + 1896 FLOPs per token) on 2 tokens per pipeline: device 1, at 1e3 FLOP/s, takes 7.68 s.
    # The next step's passes run while the plan votes: an 80 ms vote is hidden, a 12 s one shows beyond them.
    assert live.compute_s == pytest.approx(7.68)
    assert live.commit_s == pytest.approx(commit_s)


def test_equal_stages_have_the_textbook_bubble_fraction():
    model = ModelConfig(name="even", n_layers=4, d_model=8, n_heads=2, seq_len=8, vocab_size=1, batch_tokens=64,
                        micro_batches=8)
    network = Network.from_matrices(np.full((4, 4), 1.0), np.full((4, 4), 1.0))
    grid = np.arange(4).reshape(4, 1)
    plan = cost_plan(PaperCostModel(network, Payloads.from_model(model, d_dp=1, d_pp=4), d_dp=1, d_pp=4), grid)
    live = predict_step_s(plan, model, tflops=np.ones(4), memory_gib=np.ones(4))
    stage_s = np.array(model.stage_flops_per_token(4)) * 64 / 1e12
    assert live.compute_s == pytest.approx(stage_s.max())
    assert live.bubble_s == pytest.approx((stage_s.sum() - stage_s.max()) / 8)


# What a micro-batch of MODEL keeps (d 4, 1 head, T 4, V 8): a layer 36·4 + 4·1 + 16 = 164 B per token; stage 0 adds
# the 8-byte token ids and its fp32 output (4·4 B), stage 1 the head's 4·8 + 6·4 + 16 = 72 B; whatever its size,
# autocast's bf16 copy of the layer's 12·4² weights (384 B), and stage 0's int64 positions (8·4 B), stage 1's head
# matrix (2·4·8 B) and loss (4 B).
STAGE_0_TOKEN, STAGE_0_MICRO_BATCH = 164 + 8 + 16, 384 + 32
STAGE_1_TOKEN, STAGE_1_MICRO_BATCH = 164 + 72, 384 + 64 + 4


def test_memory_counts_optimizer_state_and_stored_activations():
    # 292 and 284 params · 16 B, and 2 micro-batches of 2 tokens in flight on each stage under GPipe
    assert stage_memory_bytes(MODEL, d_pp=2, d_dp=2) == [
        292 * 16 + 2 * (2 * STAGE_0_TOKEN + STAGE_0_MICRO_BATCH), 284 * 16 + 2 * (2 * STAGE_1_TOKEN + STAGE_1_MICRO_BATCH)]


def test_1f1b_holds_only_the_micro_batches_in_flight():
    # 4 micro-batches of 1 token: GPipe holds all 4 on both stages; 1F1B min(2 − s, 4), so 2 on stage 0, 1 on 1
    stage_0, stage_1 = STAGE_0_TOKEN + STAGE_0_MICRO_BATCH, STAGE_1_TOKEN + STAGE_1_MICRO_BATCH
    gpipe, one_f_one_b = (Execution.even(MODEL, 2, micro_batches=4, schedule=schedule) for schedule in ("gpipe", "1f1b"))
    assert stage_memory_bytes(MODEL, d_pp=2, d_dp=2, execution=gpipe) == [292 * 16 + 4 * stage_0, 284 * 16 + 4 * stage_1]
    assert stage_memory_bytes(MODEL, d_pp=2, d_dp=2, execution=one_f_one_b) == [292 * 16 + 2 * stage_0,
                                                                                 284 * 16 + stage_1]


def test_a_stage_on_a_device_too_small_for_it_is_refused():
    memory = ROOMY_GIB.copy()
    memory[3] = 5000 / 2**30  # below stage 1's 6392 bytes
    with pytest.raises(NoFeasiblePlan, match="stage 1 needs"):
        predict_step_s(plan_on_uniform_network(), MODEL, tflops=TFLOPS, memory_gib=memory)
