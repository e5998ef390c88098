"""Byte, count and time limits that every hetswarm node enforces on what it stores or receives."""

MAX_RECORD_BYTES = 48 * 1024
"""Largest signed DHT value: records are small by design (docs/hivemind.md, pitfall 1, for the bug large values hit)."""

MAX_LINKS_PER_RECORD = 256
"""Link measurements one PeerRecord may carry; keeps a record of a big swarm under MAX_RECORD_BYTES."""

MAX_PEERS_PER_ASSIGNMENT = 512
"""Peers one Assignment may place."""

MAX_UNREACHABLE_PER_RECORD = 16
"""Peers one Progress record may name as unreachable."""

MAX_FAILURES_PER_ATTEMPT = 4
"""Failure votes of one aborted attempt a Progress record shows (protocol/votes.py: AbortedAttempt)."""

MAX_ABORTED_PER_RECORD = 6
"""Aborted attempts one Progress record shows the failure votes of: two rounds of the default three attempts."""

ABORT_WINDOW_STEPS = 50
"""How many steps back a Progress record shows aborted attempts from (coordinator/failure_votes.py): a member that
aborts one attempt in three is caught, a fault of long ago is forgotten."""

MAX_RECENT_LOSSES = 16
"""Losses of past steps one Progress record carries."""

MAX_REQUESTED_LINKS = 64
"""Links one LinkRequests record may ask to be measured: the estimated links of one plan's hops and groups."""

MAX_REFUSED_PER_RECORD = 64
"""Refused peers the coordinator's Refusals record names (the first, by peer id, when there are more)."""

MAX_RECORDS_PER_KEY = 1024
"""Records one reader accepts under one of a swarm's keys: a Sybil flood of identities cannot make it parse and
plan an unbounded number (the peers of the plan in force and the newest records first)."""

MAX_TOKEN_CHARS = 512
"""Longest join token (protocol/join_tokens.py); a base64 RSA-2048 signature is 344 characters."""

MAX_CHECKPOINTS_PER_RECORD = 8
"""Checkpoints one PeerRecord may list."""

FRAME_PART_BYTES = 2 * 1024 * 1024
"""Tensor bytes per stream message of an activation or gradient frame (hivemind: keep messages under 4 MiB)."""

MAX_STREAM_MESSAGE_BYTES = 8 * 1024 * 1024
"""Largest single message any stream of ours reads (client/peer/hivemind_compat/streams.py): 4× the largest part we send (an
activation frame part), with room for protobuf framing."""

MAX_FRAME_HEADER_BYTES = 4 * 1024
"""Largest FrameHeader a receiver parses; a real one is about 200 bytes."""

MAX_FRAME_BYTES = 1024 * 1024 * 1024
"""Largest activation or gradient frame a receiver reads, whatever it expects; it stops reading past this."""

DHT_TIMEOUT_S = 10.0
"""Deadline of one DHT read or store; hivemind's own calls have none."""

DHT_BEAM_SIZE = 10
"""Nodes a store of a swarm key visits, and every read but a volunteer's polls (VIEW_BEAM_SIZE): twice the 5 replicas
hivemind stores a record on (the nodes nearest the key, which both find), where its default beam (20, Kademlia's k)
visits every node of a swarm of up to 20 and each answers a read with every record under the key."""

VIEW_BEAM_SIZE = 3
"""Nodes a volunteer's polls visit, of the peer records and of the coordinator's plan and link requests: the 3
nearest the key, of the 5 every store reaches. Each node visited answers with every record under the key (2.7 KB
each: 175 KB at 64 peers), so N volunteers reading DHT_BEAM_SIZE nodes each moved 10·N² records per view interval,
the largest load of a standing-by swarm, and a read lasted as long as the slowest of 10 busy nodes
(benchmarks/swarm_scale.py). A record one poll misses stays in view until it expires (protocol/remembered_peers.py),
and a plan one poll misses comes with the next. The coordinator's view, which it plans on, reads DHT_BEAM_SIZE: read
at 3 nodes, it lost a live peer of a CI run's swarm (records living 10 s) and planned it out."""

MAX_RECORD_TTL_S = 3600.0
"""Longest a record may live in the DHT: every node refuses an expiration further ahead (protocol/signing.py)."""

MAX_CLOCK_SKEW_S = 30.0
"""How far in the future a record's own timestamp may be (hivemind peers refuse clocks 3 s apart)."""

# Physical bounds of what a record may claim; every node refuses a record outside them (protocol/records.py).
MAX_LATENCY_MS = 60_000.0
"""One-way latency: a minute is far beyond any link that can train."""
MAX_BANDWIDTH_MBPS = 1_000_000.0
"""1 Tbit/s, above the fastest network card."""
MAX_TFLOPS = 10_000.0
"""Above any single accelerator (an H100 does about 990 dense bf16 TFLOPS)."""
MAX_MEMORY_GIB = 16_384.0
MAX_SECONDS = 1_000_000.0
"""Any duration a record reports (step compute, waits, hand-offs, predictions): about 11 days."""
MAX_STEP = 10**9
MAX_LAYERS = 4096
"""Layers of a model, and so the ends of any layer range a record names: past any transformer trained (hundreds)."""
"""Steps and plan versions: a billion steps is beyond any run; keeps counters far from msgpack's int64 edge."""
MAX_LOSS = 1_000_000.0
MAX_TIMESTAMP = 1e11
"""DHT times (seconds since 1970) below this: the year 5138."""
