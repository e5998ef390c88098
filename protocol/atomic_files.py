"""Files written whole or not at all: readers never see half a plan, half a state file or half a checkpoint."""
from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["write_bytes", "write_json"]


def write_bytes(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Writes `data` to a temporary file beside `path`, then renames it over `path`; `durable` also survives a power
    cut (fsync of the file before the rename and of the folder after it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as file:
        file.write(data)
        if durable:
            file.flush()
            os.fsync(file.fileno())
    os.replace(partial, path)
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def write_json(path: Path, data: dict, *, durable: bool = False) -> None:
    write_bytes(path, json.dumps(data, indent=1).encode(), durable=durable)
