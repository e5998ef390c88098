"""Options shared by several `hetswarm` commands, defined once (as huggingface_hub's `hf` keeps its aliases)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.logging import RichHandler

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging and full tracebacks.")]

console = Console()
err_console = Console(stderr=True)


def configure_logging(verbose: bool) -> None:
    """One handler for hetswarm's loggers, on stderr so that stdout stays clean for --json."""
    handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=verbose)
    root = logging.getLogger("hetswarm")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False

InitialPeersOpt = Annotated[
    list[str], typer.Option("--initial-peers", help="Multiaddrs of peers in the swarm (/ip4/HOST/tcp/PORT/p2p/ID).")
]
HostMaddrsOpt = Annotated[
    list[str], typer.Option("--host-maddrs", help="Multiaddrs to listen on; volunteers use /ip4/0.0.0.0/tcp/PORT.")
]
AnnounceMaddrsOpt = Annotated[
    list[str], typer.Option("--announce-maddrs", help="Multiaddrs others should dial (behind port forwarding).")
]
IdentityPathOpt = Annotated[
    Optional[Path], typer.Option("--identity-path", help="libp2p identity file (RSA); created if missing.")
]
SwarmOpt = Annotated[str, typer.Option("--swarm", help="Swarm name; one DHT can hold several swarms.")]
CoordinatorOpt = Annotated[
    Optional[str], typer.Option("--coordinator", help="Peer id of the coordinator to trust (its `Coordinator peer id:` line).")
]
