"""A stage's training state as plain named tensors: what a hand-off sends, a checkpoint holds and a replica compares.

Names are global, not positional: a parameter is named as in the full model (``blocks.5.mlp.fc.weight``: the stage
module keys its blocks by global layer index, client/training/model.py) and its AdamW state as
``blocks.5.mlp.fc.weight:exp_avg``. So the state of layers [a, b) means the same whatever plan cut the model, and
a stage of a new cut can be assembled from the holders of the old one, unit by unit. A *unit* is what one
``StageModule`` part holds: ``embed``, ``blocks.<i>`` or ``head``.

``step`` is the step the state is ready for: every step before it has been applied (the data position follows from
it, since batches are a pure function of the step, client/training/data.py).

The byte form is deterministic (names sorted, a small JSON header per tensor, then its raw bytes), so a SHA-256 of it
identifies a state and holders of the same state report the same digest (hivemind's ``rpc_download_state`` sends
torch-serialized parts with no such check).
"""
from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.keys import ReadyStep

__all__ = ["StageState", "byte_parts", "decode_tensors", "encode_tensors", "majority_digest", "unit_digests",
           "unit_encodings", "unit_of", "units_of_layers", "units_root"]

Digest = TypeVar("Digest", str, bytes)

_DTYPES = {str(dtype): dtype for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64)}
_HEADER = struct.Struct("<I")
_MAX_TENSOR_HEADER = 1024
_PART_BYTES = 1 << 20
"""Bytes per stream message when a state is sent (hivemind: keep messages well under 4 MiB)."""


def unit_of(name: str) -> str:
    """The unit a tensor name belongs to: ``embed``, ``head`` or ``blocks.<i>``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


def units_of_layers(layers: tuple[int, int], n_layers: int) -> list[str]:
    """The units of the stage holding layers [a, b): the embedding on the first, the head on the last."""
    a, b = layers
    return ["embed"] * (a == 0) + [f"blocks.{i}" for i in range(a, b)] + ["head"] * (b == n_layers)


@dataclass(frozen=True, slots=True)
class StageState:
    """Parameters and optimizer state of some units, ready for ``step``; tensors are CPU copies."""

    step: ReadyStep
    tensors: dict[str, torch.Tensor]

    @classmethod
    def capture(cls, module: torch.nn.Module, optimizer: torch.optim.Optimizer, step: ReadyStep) -> StageState:
        """A CPU copy of ``module``'s parameters and their AdamW state (empty before the first optimizer step); a
        parameter with two names (tied embeddings) under both, so that a state means the same whatever the cut."""
        tensors = {}
        for name, param in module.named_parameters(remove_duplicate=False):
            tensors[name] = param.detach().to("cpu", copy=True)
            for key, value in optimizer.state.get(param, {}).items():
                tensors[f"{name}:{key}"] = value.detach().to("cpu", copy=True)
        return cls(step, tensors)

    def apply(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Loads this state into the parameters of ``module`` it covers, whole units at a time (the others keep
        theirs: units a plan rebuilds from the seed), and their AdamW state into ``optimizer``.

        Raises:
            RejectedInput: a tensor is not one of the module's, a unit is incomplete, or a shape differs.
        """
        params = {name: p for name, p in module.named_parameters(remove_duplicate=False)
                  if unit_of(name) in set(self.units)}
        missing = sorted(set(params) - set(self.tensors))
        extra = sorted(name for name in self.tensors if name.split(":")[0] not in params)
        if missing or extra:
            raise RejectedInput(f"state of step {self.step} does not fit the stage: missing {missing[:3]}, "
                                f"extra {extra[:3]}")
        with torch.no_grad():
            for name, param in params.items():
                if self.tensors[name].shape != param.shape:
                    raise RejectedInput(f"{name}: state has shape {tuple(self.tensors[name].shape)}, the stage "
                                        f"{tuple(param.shape)}")
                param.copy_(self.tensors[name])
        for name, param in params.items():
            prefix = f"{name}:"
            state = {key[len(prefix):]: value.clone() for key, value in self.tensors.items() if key.startswith(prefix)}
            optimizer.state.pop(param, None)
            if state:
                optimizer.state[param] = {key: value if key == "step" else value.to(param.device)
                                          for key, value in state.items()}  # AdamW keeps its step on the CPU

    def select(self, units: list[str]) -> StageState:
        """The part of this state that belongs to ``units``.

        Raises:
            KeyError: a unit is not held here.
        """
        held = {unit_of(name) for name in self.tensors}
        if absent := [unit for unit in units if unit not in held]:
            raise KeyError(f"units not held: {absent}")
        wanted = set(units)
        return StageState(self.step, {name: t for name, t in self.tensors.items() if unit_of(name) in wanted})

    def merge(self, other: StageState) -> StageState:
        if other.step != self.step:
            raise ValueError(f"cannot merge states of steps {self.step} and {other.step}")
        return StageState(self.step, self.tensors | other.tensors)

    @property
    def units(self) -> list[str]:
        return sorted({unit_of(name) for name in self.tensors})

    def encode(self) -> bytes:
        return encode_tensors(self.tensors)

    def digest(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()


def unit_encodings(state: StageState) -> dict[str, bytes]:
    """Each unit's encoding, in `state.units` order. Joined, they are `state.encode()`: a unit's tensor names all start
    with the unit and a dot, so they sort together, and in the order of the units' names."""
    return {unit: state.select([unit]).encode() for unit in state.units}


def unit_digests(encodings: Mapping[str, bytes]) -> dict[str, str]:
    """The SHA-256 (hex) of each unit's encoding: what a holder reports for it and a download is checked against
    (client/training/state_handoff.py)."""
    return {unit: hashlib.sha256(blob).hexdigest() for unit, blob in encodings.items()}


def units_root(digests: Mapping[str, str]) -> str:
    """One digest for a set of unit digests: a checkpoint's, which its saver publishes and the coordinator records,
    so that a holder's unit digests can be checked against the checkpoint the saver wrote."""
    return hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()


def merged(part: StageState | None, other: StageState | None) -> StageState | None:
    """Two parts of one step's state as one; either may be None (nothing held)."""
    if part is None or other is None:
        return part or other
    return part.merge(other)


def majority_digest(holdings: Mapping[str, Digest], *, salt: str) -> Digest:
    """The digest most holders (peer ids, base58) report; among equally many, the one held by the winner of a lottery
    drawn by hashing `salt` with each holder's id. The salt names the plan and the step, which no peer knows when it
    makes its identity: a tie-break by the lowest peer id would let anyone who grinds a low id win every tie."""
    counts = Counter(holdings.values())

    def ticket(holder: str) -> bytes:
        return hashlib.sha256(f"{salt}\0{holder}".encode()).digest()

    return min(counts, key=lambda digest: (-counts[digest], min(ticket(holder) for holder, held in holdings.items()
                                                                  if held == digest)))


def byte_parts(blob: bytes) -> Iterator[bytes]:
    """An encoded state cut into the stream messages that carry it."""
    for offset in range(0, len(blob), _PART_BYTES):
        yield blob[offset:offset + _PART_BYTES]


def encode_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """Deterministic bytes of named tensors (module docstring)."""
    chunks = []
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        header = json.dumps({"name": name, "dtype": str(tensor.dtype), "shape": list(tensor.shape)}).encode()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""  # 0-d too
        chunks += [_HEADER.pack(len(header)), header, struct.pack("<Q", len(raw)), raw]
    return b"".join(chunks)


def decode_tensors(blob: bytes) -> dict[str, torch.Tensor]:
    """The inverse of ``encode_tensors``.

    Raises:
        RejectedInput: the bytes are not such a encoding (truncated, bad header, sizes that do not add up).
    """
    tensors, offset = {}, 0
    try:
        while offset < len(blob):
            (header_len,) = _HEADER.unpack_from(blob, offset)
            if header_len > _MAX_TENSOR_HEADER:
                raise RejectedInput(f"tensor header of {header_len} bytes at offset {offset}")
            header = json.loads(blob[offset + 4:offset + 4 + header_len])
            offset += 4 + header_len
            (raw_len,) = struct.unpack_from("<Q", blob, offset)
            offset += 8
            dtype, shape = _DTYPES[header["dtype"]], [int(n) for n in header["shape"]]
            expected = dtype.itemsize * int(torch.Size(shape).numel())
            if raw_len != expected or offset + raw_len > len(blob):
                raise RejectedInput(f"{header['name']}: {raw_len} bytes for {dtype} {shape} at offset {offset}")
            if raw_len:
                raw = torch.frombuffer(bytearray(blob[offset:offset + raw_len]), dtype=torch.uint8)
                tensors[str(header["name"])] = raw.view(dtype).reshape(shape)
            else:
                tensors[str(header["name"])] = torch.empty(shape, dtype=dtype)
            offset += raw_len
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise RejectedInput(f"not an encoded stage state ({type(e).__name__}: {e})") from None
    return tensors
