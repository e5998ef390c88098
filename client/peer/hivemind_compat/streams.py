"""A bound on every stream message a process reads, installed in hivemind 1.1.12's stream reader.

hivemind reads a stream message whole, with a length its sender states (up to 2^64 bytes,
`P2P.receive_raw_data`, a static method every stream handler and stream call goes through); nothing in its API
bounds it. `bound_stream_messages` replaces that reader, for the whole process, by one that refuses a stated length
over MAX_STREAM_MESSAGE_BYTES before reading it, so that no handler, nor any caller reading a response, can be made
to buffer more (client/peer/peer_gate.py bounds the calls themselves). `unbound_stream_messages` puts hivemind's
back, for tests that need the unbounded reader.
"""
from __future__ import annotations

import asyncio

from hivemind.p2p import P2P

from hetswarm.protocol.limits import MAX_STREAM_MESSAGE_BYTES

__all__ = ["MessageTooLarge", "bound_stream_messages", "unbound_stream_messages"]

_HIVEMIND_RECEIVE_RAW_DATA = P2P.__dict__["receive_raw_data"]


class MessageTooLarge(ConnectionError):
    """A stream message whose stated length is over MAX_STREAM_MESSAGE_BYTES; the stream is closed unread."""


async def _bounded_receive_raw_data(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(P2P.HEADER_LEN)
    length = int.from_bytes(header, P2P.BYTEORDER)
    if length > MAX_STREAM_MESSAGE_BYTES:
        raise MessageTooLarge(f"a stream message of {length} bytes is over the {MAX_STREAM_MESSAGE_BYTES}-byte limit")
    return await reader.readexactly(length)


def bound_stream_messages() -> None:
    """Caps every stream message this process reads from now on (module docstring); idempotent."""
    P2P.receive_raw_data = staticmethod(_bounded_receive_raw_data)


def unbound_stream_messages() -> None:
    """Puts hivemind's own reader back (module docstring); idempotent."""
    P2P.receive_raw_data = _HIVEMIND_RECEIVE_RAW_DATA
