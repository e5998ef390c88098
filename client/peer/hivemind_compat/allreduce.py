"""hivemind 1.1.12's `AllReduceRunner` with its private steps opened as hooks under names of our own.

A round of hivemind's runner (hivemind/averaging/allreduce.py) is: for every reducer, `_communicate_with_peer`
(this member's own share reduced in place, or a remote reducer's stream: `_generate_input_for_peer` out, averages
back, over a stub from `_get_peer_stub`); for every sender's incoming stream, `_accumulate_parts_streaming`;
`_ban_sender` drops a sender from the round. hetswarm's exact runner (client/training/exact_allreduce.py) replaces
three of those steps and calls the others, so that every member ends with identical bits and trusts no sender.
The runner's public API offers none of it; `HookedAllReduceRunner` names each step once, here, and defaults every
hook to hivemind's own.
"""
from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator

import torch
from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.compression import CompressionInfo
from hivemind.p2p import PeerID, StubBase
from hivemind.proto import averaging_pb2

__all__ = ["HookedAllReduceRunner"]


class HookedAllReduceRunner(AllReduceRunner):
    """hivemind's runner, whose private steps call the public hooks `communicate_with`, `parts_for_reducer` and
    `reduce_sender_parts` (module docstring)."""

    @property
    def sent_parts(self) -> list[deque[tuple[torch.Tensor, CompressionInfo]]]:
        """Reducer index → the parts this member sends it (itself included), as hivemind split its tensors; hivemind
        frees them once the round ends."""
        return self.tensor_part_container._input_parts_by_peer

    def peer_stub(self, peer_id: PeerID) -> StubBase:
        """The stub that calls `peer_id`'s runner of this group."""
        return self._get_peer_stub(peer_id)

    async def ban_sender(self, peer_id: PeerID) -> None:
        """Leaves `peer_id`'s parts out of this round (it shows in `banned_senders`)."""
        await self._ban_sender(peer_id)

    async def communicate_with(self, peer_id: PeerID) -> None:
        """Hook: this member's exchange with the reducer `peer_id` (itself included)."""
        await super()._communicate_with_peer(peer_id)

    def parts_for_reducer(self, peer_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        """Hook: the stream of this member's parts for reducer `peer_index`."""
        return super()._generate_input_for_peer(peer_index)

    def reduce_sender_parts(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                            sender_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        """Hook: reduces a sender's stream of parts, answering each with its average."""
        return super()._accumulate_parts_streaming(stream, sender_index)

    async def _communicate_with_peer(self, peer_id: PeerID) -> None:
        await self.communicate_with(peer_id)

    def _generate_input_for_peer(self, peer_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        return self.parts_for_reducer(peer_index)

    def _accumulate_parts_streaming(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                                    sender_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        return self.reduce_sender_parts(stream, sender_index)
