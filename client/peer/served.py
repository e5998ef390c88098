"""What a peer serves on one namespace of its P2P for as long as a plan runs: its handlers go up with `attach` and
come down with `detach`, so that a plan's calls reach only the objects of the plan in force (a servicer of an old
plan answers nothing once detached)."""
from __future__ import annotations

from hivemind.p2p import P2P, ServicerBase

__all__ = ["Served"]


class Served:
    """A mixin for what serves `handlers` (itself, by default: a ServicerBase) under `namespace` on `p2p`."""

    p2p: P2P
    namespace: str

    @property
    def handlers(self) -> ServicerBase:
        return self

    async def attach(self) -> None:
        await self.handlers.add_p2p_handlers(self.p2p, namespace=self.namespace)

    async def detach(self) -> None:
        await self.handlers.remove_p2p_handlers(self.p2p, namespace=self.namespace)
