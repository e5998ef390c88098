"""Options shared by several `hetswarm` commands, defined once (as huggingface_hub's `hf` keeps its aliases)."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.logging import RichHandler
from typer.core import TyperCommand, TyperOption

from hetswarm.client.peer.addresses import DEFAULT_METRICS_HOST, MetricsAddress
from hetswarm.protocol.errors import HetswarmError, RejectedInput

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging and full tracebacks.")]
LogFormatOpt = Annotated[str, typer.Option("--log-format", help="text for people; json for log collectors: one JSON "
                                                                "object a line on stderr, hivemind's lines too.")]
ENVVAR_PREFIX = "HETSWARM_"

console = Console()
err_console = Console(stderr=True)


class EnvvarCommand(TyperCommand):
    """A command each of whose options can also be set by the environment variable HETSWARM_<OPTION> (listed in
    --help), so a volunteer's service file or container needs no long command line; the command line wins."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperOption) and param.envvar is None:
                param.envvar = ENVVAR_PREFIX + param.name.upper()
                param.show_envvar = True


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message (and the traceback, when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": record.created, "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def new_app(**settings) -> typer.Typer:
    """A typer app with the command's shared settings (`-h` for help, plain tracebacks)."""
    return typer.Typer(rich_markup_mode="rich", context_settings={"help_option_names": ["-h", "--help"]},
                       pretty_exceptions_enable=False, **settings)


def run(app: typer.Typer, **kwargs) -> None:
    """Runs `app`: expected errors become one red line on stderr and exit code 1 (tracebacks with --verbose)."""
    try:
        app(**kwargs)
    except HetswarmError as e:
        if logging.getLogger("hetswarm").isEnabledFor(logging.DEBUG):
            raise
        err_console.print(f"[red]error:[/red] {e}", soft_wrap=True)
        sys.exit(1)


def configure_logging(verbose: bool, log_format: str = "text") -> None:
    """One handler for hetswarm's loggers, on stderr so that stdout stays clean for --json. In json format every
    logger (hivemind's, asyncio's, warnings) goes through the same handler, so that every line on stderr parses."""
    if log_format not in ("text", "json"):
        raise RejectedInput(f"--log-format must be text or json, got {log_format!r}")
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLogFormatter())
        from hivemind.utils.logging import use_hivemind_log_handler  # here: `hetswarm schedule` runs without hivemind

        use_hivemind_log_handler("in_root_logger")  # hivemind's records reach the root logger, as asyncio's do
        logging.getLogger().handlers[:] = [handler]
        logging.captureWarnings(True)
    else:
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
MetricsPortOpt = Annotated[
    Optional[int], typer.Option("--metrics-port", min=0, max=65535, help="Serve Prometheus metrics at "
                                "http://HOST:PORT/metrics (0: any free port, logged); off when not given.")
]
MetricsHostOpt = Annotated[
    str, typer.Option("--metrics-host", help="Where --metrics-port listens: 127.0.0.1 keeps the metrics on this "
                      "machine; 0.0.0.0 offers them to the network (no authentication).")
]


def metrics_address(port: int | None, host: str) -> MetricsAddress | None:
    """--metrics-port and --metrics-host as one address; None (no metrics) without a port."""
    if port is None:
        if host != DEFAULT_METRICS_HOST:
            raise RejectedInput("--metrics-host only makes sense with --metrics-port PORT")
        return None
    return MetricsAddress(port=port, host=host)
