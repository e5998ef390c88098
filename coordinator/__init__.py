"""Scheduling: the DT-FM cost model, its exact inner solvers and the evolutionary search (numpy/scipy only; the
model shapes it prices are hetswarm.protocol.model_config, since they travel in every Assignment, and the networks
it plans over are hetswarm.protocol.network, since link emulation reads the same scenarios).

 * cost_model.py   - Payloads, CostBreakdown, the CostEvaluator protocol and PaperCostModel (DataP + 2·PipeP)
 * matching.py     - bottleneck perfect matching between two stage groups (threshold search + augmenting paths)
 * tsp.py          - open-path TSP over stage groups: exact Held–Karp, heuristic beyond 12 groups
 * neighbourhood.py - candidates, cached terms and swap local search with incremental evaluation
 * search.py       - SearchConfig and the project's memetic search
 * paper_ga.py     - the paper's hybrid GA, re-implemented as a baseline
 * baselines.py    - random and default (device-order) placement
 * plan.py         - Plan (stage × replica grid), cost_plan, plan_from_partition
 * scheduler.py    - find_plan: network + payloads in, deployable plan out
 * live_cost.py    - the live cost model: paper communication + per-peer compute + pipeline bubble + memory
 * swarm_view.py   - SwarmView: peer records → matrices, unmeasured links estimated and flagged
 * planner.py      - proposals: shape choice, placement, live price
 * replanner.py    - Replanner: when a proposal becomes a published plan (debounce, hysteresis, sticky roles, adopt)
 * reports.py      - members' reports of unreachable peers, corroborated (a second report, or our own ping)
 * failure_votes.py - the signed failure votes of aborted attempts, judged: who keeps the plan from committing
                     (imports hivemind, to check signatures)
 * run_state.py    - what a coordinator remembers across restarts (its state file); the start step of a plan
 * state_plan.py   - where a new plan's training state comes from: hand-off, checkpoints, or the seed; savers
 * checkpoint_ledger.py - the roots of the checkpoints the named savers wrote: what a resume may load
 * sticky.py       - stages peers hold, the price of moving them, the plan in force with its gaps filled
 * admission.py    - who may be planned: everyone, or (closed) the allow-list and holders of our join tokens
 * claims.py       - claimed TFLOPS against reported compute times; liars priced by what they do
 * assignment_record.py - the signed Assignment built from a priced proposal, with the plan's one price
 * recovery.py     - a restarted coordinator: versions above the swarm's, the plan in force taken over
 * state_sourcing.py - where each new plan's state comes from, and what that needs remembered across plans
 * refusals_board.py - the Refusals record: peers not planned or priced by what they do, with the reasons
 * broadcaster.py  - the coordinator's loop over the DHT: signed, versioned Assignments (imports hivemind;
                     not re-exported here, so that the scheduler imports without it)
"""
from hetswarm.coordinator.cost_model import CostBreakdown, CostEvaluator, PaperCostModel, Payloads
from hetswarm.coordinator.plan import Plan, cost_plan, plan_from_partition
from hetswarm.coordinator.scheduler import ScheduleResult, find_plan
from hetswarm.coordinator.search import SearchConfig, SearchProgress
from hetswarm.protocol.network import InvalidNetwork, Network, load_network

__all__ = [
    "CostBreakdown", "CostEvaluator", "InvalidNetwork", "Network", "PaperCostModel", "Payloads", "Plan",
    "ScheduleResult", "SearchConfig", "SearchProgress", "cost_plan", "find_plan", "load_network",
    "plan_from_partition",
]
