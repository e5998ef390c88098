"""Scheduling: the DT-FM cost model, its exact inner solvers and the evolutionary search (numpy/scipy only; the
model shapes it prices are hetswarm.protocol.model_config, since they travel in every Assignment, and the networks
it plans over are hetswarm.protocol.network, since link emulation reads the same scenarios). Nothing here imports
hivemind, torch or pydantic (tests/test_import_doors.py imports every module of this folder to check).

 * cost_model.py     - Payloads, CostBreakdown, the CostEvaluator protocol and PaperCostModel (DataP + 2·PipeP)
 * matching.py       - bottleneck perfect matching between two stage groups (threshold search + augmenting paths)
 * tsp.py            - open-path TSP over stage groups: exact Held–Karp, heuristic beyond 12 groups
 * neighbourhood.py  - candidates, cached terms and swap local search with incremental evaluation
 * search.py         - SearchConfig and the project's memetic search
 * paper_ga.py       - the paper's hybrid GA, re-implemented as a baseline
 * baselines.py      - random and default (device-order) placement
 * plan.py           - Plan (stage × replica grid), cost_plan, plan_from_partition
 * scheduler.py      - find_plan: network + payloads in, deployable plan out
 * live_cost.py      - the live cost model: paper communication + per-peer compute + pipeline bubble + memory
 * live_objective.py - the live model as the search's objective, and the shapes and executions it tries
 * wire_choice.py    - a placement priced for a wire, and the codec per hop and stage group `auto` chooses
"""
