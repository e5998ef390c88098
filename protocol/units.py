"""Unit conversions, defined once: records carry Mbit/s and GiB, the DT-FM cost model reads Gbit/s and GB."""

BYTES_PER_GIB = 2**30
BYTES_PER_GB = 10**9
"""Decimal gigabytes: the DT-FM cost model's payloads (docs/dtfm.md, Cost model)."""
MBPS_PER_GBPS = 1000.0
BITS_PER_MBIT = 10**6
MS_PER_S = 1000.0
