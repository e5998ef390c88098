"""What crosses the wire between hetswarm peers. Importing this package loads no hivemind: the scheduler (which
imports the errors) must stay usable without it.

 * errors.py       - HetswarmError, the base of every expected failure, and RejectedInput for bad input
 * limits.py       - byte, count and time limits that every receiver enforces
 * units.py        - unit conversions (Mbit/s and Gbit/s, GB and GiB), defined once
 * model_config.py - model shapes, and the payload bytes (c_DP, c_PP) and FLOPs derived from them (pure Python)
 * network.py      - Network: latency/bandwidth matrices and device sites, validated; the packaged scenarios (numpy;
                   the scheduler plans over them, link emulation replays them)
 * records.py      - PeerRecord, Assignment, Progress, Refusals: pydantic.v1 schemas, strict types, physical bounds
 * keys.py         - DHT keys and P2P handler namespaces of one swarm; the short peer id people read
 * identity.py     - the RSA key that is both libp2p identity and record-signing key; peer id of a key
 * votes.py        - signed commit votes and the evidence of aborted attempts: schemas, read without hivemind
 * vote_signing.py - signing a vote, and checking that a vote is its member's
 * part_statements.py - a sender's signed statement of the all-reduce parts it sent a reducer
 * signing.py      - the validators every node installs (size, RSA signature, owner binding, lifetime, schema)
 * join_tokens.py  - the coordinator's signed tokens that admit one peer to a closed swarm
 * atomic_files.py - files written whole or not at all (temporary file, fsync, rename)
 * record_store.py - SwarmRecords: publish our signed records, read everyone's by signer, each call with a deadline
 * remembered_peers.py - peers kept in view until their records expire, so one partial read removes nobody
 * measurement_policy.py - which links a peer measures within its budget (the plan's, its site's, a rotating
                   sample); volunteers follow it and the coordinator expects what it yields
 * wire_format.py  - the codec of each transfer of a plan (per hop and stage group where chosen so) and the bytes the
                     cost model prices (pure Python: the scheduler prices a wire without pydantic)
 * codecs.py       - tensors encoded in those codecs with hivemind's serializers, and their error bounds
 * framing.py      - activation/gradient frames on a stream, and the receiver's checks
 * rpc_messages.py - the small messages of the other calls (state questions, audits, dial-backs): schemas, one reader
"""
from hetswarm.protocol.errors import HetswarmError, RecordTooLarge, RejectedInput

__all__ = ["HetswarmError", "RecordTooLarge", "RejectedInput"]
