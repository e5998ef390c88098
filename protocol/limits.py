"""Byte, count and time limits that every hetswarm node enforces on what it stores or receives."""

MAX_RECORD_BYTES = 48 * 1024
"""Largest signed DHT value: records are small by design (docs/hivemind.md, pitfall 1, for the bug large values hit)."""

MAX_LINKS_PER_RECORD = 256
"""Link measurements one PeerRecord may carry; keeps a record of a big swarm under MAX_RECORD_BYTES."""

MAX_PEERS_PER_ASSIGNMENT = 512
"""Peers one Assignment may place."""

MAX_UNREACHABLE_PER_RECORD = 16
"""Peers one Progress record may name as unreachable."""

MAX_CHECKPOINTS_PER_RECORD = 8
"""Checkpoints one PeerRecord may list."""

FRAME_PART_BYTES = 2 * 1024 * 1024
"""Tensor bytes per stream message of an activation or gradient frame (hivemind: keep messages under 4 MiB)."""

MAX_FRAME_HEADER_BYTES = 4 * 1024
"""Largest FrameHeader a receiver parses; a real one is about 200 bytes."""

MAX_FRAME_BYTES = 1024 * 1024 * 1024
"""Largest activation or gradient frame a receiver reads, whatever it expects; it stops reading past this."""

DHT_TIMEOUT_S = 10.0
"""Deadline of one DHT read or store; hivemind's own calls have none."""
