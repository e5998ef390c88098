"""The coordinator: the DT-FM scheduler (scheduling/, numpy/scipy only) and the peer that runs it for a swarm.

 * scheduling/     - the cost models, the exact inner solvers, the search and its baselines: pure, no hivemind,
                     torch or pydantic (tests/test_import_doors.py), so a researcher plans on a laptop
 * swarm_view.py   - SwarmView: peer records → matrices, unmeasured links estimated and flagged
 * link_estimate.py - the estimates' models (network coordinates, access and site capacities), their held-out error
 * planner.py      - proposals: shape choice, placement, live price
 * replanner.py    - Replanner: when a proposal becomes a published plan (debounce, hysteresis, sticky roles, adopt)
 * measurement_wait.py - the bounded waits for links to be measured, and the estimated links asked for first
 * reports.py      - members' reports of unreachable peers, corroborated (a second report, or our own ping)
 * failure_votes.py - the signed failure votes of aborted attempts, judged: who keeps the plan from committing
                     (imports hivemind, to check signatures)
 * run_state.py    - what a coordinator remembers across restarts (its state file); the start step of a plan
 * state_plan.py   - where a new plan's training state comes from: hand-off, checkpoints, or the seed; savers
 * checkpoint_ledger.py - the roots of the checkpoints the named savers wrote: what a resume may load
 * sticky.py       - stages peers hold, the price of moving them, the plan in force with its gaps filled
 * admission.py    - who may be planned: everyone, or (closed) the allow-list and holders of our join tokens
 * claims.py       - claimed TFLOPS against reported compute times; liars priced by what they do
 * loss_watch.py   - the members' losses, corroborated: a spike that rolls the swarm back to a checkpoint
 * assignment_record.py - the signed Assignment built from a priced proposal, with the plan's one price
 * recovery.py     - a restarted coordinator: versions above the swarm's, the plan in force taken over
 * state_sourcing.py - where each new plan's state comes from, and what that needs remembered across plans
 * notices.py      - the Refusals record (peers not planned or priced by what they do, with the reasons) and the
                     LinkRequests record (estimated links a plan relies on, measured before it is published)
 * plan_in_force.py - the one plan in force: its signed assignment, this run's pricing, where it came from
 * screening.py    - each round's admission, claims and ledger checks of the peers in view
 * broadcaster.py  - the coordinator's loop over the DHT: signed, versioned Assignments (imports hivemind;
                     not re-exported here, so that the scheduler imports without it)
"""
from hetswarm.coordinator.scheduling.cost_model import CostBreakdown, CostEvaluator, PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.plan import Plan, cost_plan, plan_from_partition
from hetswarm.coordinator.scheduling.scheduler import ScheduleResult, find_plan
from hetswarm.coordinator.scheduling.search import SearchConfig, SearchProgress
from hetswarm.protocol.network import InvalidNetwork, Network, load_network

__all__ = [
    "CostBreakdown", "CostEvaluator", "InvalidNetwork", "Network", "PaperCostModel", "Payloads", "Plan",
    "ScheduleResult", "SearchConfig", "SearchProgress", "cost_plan", "find_plan", "load_network",
    "plan_from_partition",
]
