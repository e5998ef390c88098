"""The pipeline runtime: one stage of a plan, trained over direct peer streams. Of ours it imports only
hetswarm.protocol and hetswarm.client.peer. The package imports none of its modules: a stage's compute (model,
llama, pipeline_schedule, reference) loads without hivemind or pydantic, as on a GPU machine with torch alone
(benchmarks/gpu_stage.py).

 * model.py             - stages of GPT-2 (nanoGPT-style) or Llama blocks and their loss, for a layer range, seeded
 * llama.py             - Llama parts from transformers' modules, and their Hugging Face names
 * gpt2_hf.py           - our GPT-2 tensors as a Hugging Face GPT2LMHeadModel names and lays them out
 * hf_folder.py         - Hugging Face folders: a config, a stage's tensors by key, an export
 * data.py              - the tokens a pipeline draws its micro-batches from: bytes of text, or a prepared folder's;
                          a default corpus that needs no download
 * prepared_data.py     - `hetswarm data prepare`: documents tokenized into flat token files, an index, a digest
 * reference.py         - the single-process step that a distributed step must equal
 * neighbour_streams.py - activation and gradient frames between pipeline neighbours
 * group_allreduce.py   - a stage group's gradient all-reduce: one round per step, partial rounds refused
 * exact_allreduce.py   - the runner of a round (hivemind AllReduceRunner): bit-identical averages, no sender trusted
 * part_bounds.py       - how large a gradient part or an average may honestly be in a round
 * reduction_audit.py   - every member re-reduces one part of each other reducer's share from its signed parts
 * tied_embeddings.py   - tied embeddings cut into stages: the first and last stages' copies kept equal
 * activation_memory.py - what a stage's forward keeps for its backward, measured (the cost model's check)
 * error_feedback.py    - what a compressed all-reduce cut from a gradient, carried into the next step
 * robust_aggregation.py - CenteredClip, the aggregation a few hostile members cannot move far
 * step_commit.py       - all-or-nothing steps: the plan-wide commit vote over (step, attempt)
 * replica_sync.py      - replicas compare state hashes and a differing one is resynchronised
 * pipeline_schedule.py - the order of a stage's forward and backward passes: GPipe or 1F1B
 * step_clock.py        - where a step's time goes: compute, waiting, the neighbours' timings
 * stage_passes.py      - a stage's forward and backward passes of one step, in its schedule, with its frames
 * run_ahead.py         - a single stage's next step computed while the plan votes on this one
 * stage_worker.py      - one stage's step: passes, all-reduce, vote, apply; retried attempts
 * stage_start.py       - this peer's stage of a plan built from the assignment, serving once its peers answer
 * stage_state.py       - a stage's parameters and optimizer state as named tensors: hashed, encoded, re-cut
 * state_server.py      - the states a peer holds and serves to others: its last ones, old stages, checkpoints
 * state_handoff.py     - a peer that takes a stage downloads its state from the peers that hold it
 * checkpoints.py       - the stage's state on a volunteer's disk, written atomically in the background, and
                          the newest step a set of them holds whole
 * errors.py            - StageError and its kinds: refused frame, silent neighbour, partial all-reduce,
                          a step aborted on every attempt, a commit whose outcome is unknown
 * plan_session.py      - one accepted assignment: start step, state, stage, heartbeat, the loop of steps
 * progress_report.py   - the Progress records a training peer publishes, built and sent in the background
 * trainer.py           - follows assignments in version order, one session at a time; serves the states it
                          hands off and keeps checkpoints
"""
