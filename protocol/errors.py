"""The exception family every hetswarm room raises from, so the CLI has one way out for expected errors."""


class HetswarmError(Exception):
    """An expected failure with a message meant for the user (bad input, unreachable peer, no feasible plan)."""


class RejectedInput(HetswarmError):
    """Input from a user or a peer that hetswarm refuses: malformed, forged, oversized or of the wrong shape."""


class RecordTooLarge(RejectedInput):
    """A DHT record over the size limit; hivemind's DHT process crashes on values over ~64 KiB."""


class ConfigError(HetswarmError, ValueError):
    """A configuration that cannot work (a bad option, an impossible shape); a ValueError too, for library users."""
