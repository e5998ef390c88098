"""What crosses the wire between hetswarm peers. Importing this package loads no hivemind: the scheduler (which
imports the errors) must stay usable without it.

 * errors.py       - HetswarmError, the base of every expected failure, and RejectedInput for bad input
 * limits.py       - byte and count limits that every receiver enforces
 * records.py      - PeerRecord, Assignment, Progress: pydantic.v1 schemas with strict types
 * keys.py         - DHT key names of one swarm
 * identity.py     - the RSA key that is both libp2p identity and record-signing key; peer id of a key
 * signing.py      - the validators every node installs (size, RSA signature, owner binding, schema)
 * record_store.py - publish our signed record; read everyone's, keyed by signer
 * framing.py      - activation/gradient frames on a stream, and the receiver's checks
"""
from hetswarm.protocol.errors import HetswarmError, RecordTooLarge, RejectedInput

__all__ = ["HetswarmError", "RecordTooLarge", "RejectedInput"]
