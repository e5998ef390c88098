"""The volunteer's compute: matmul TFLOPS on the device it will train on, and its memory.

Measured once per (device name, dtype) and cached, as Petals caches its throughput, so a restart is instant.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
import time
from pathlib import Path

import psutil
import torch

from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.records import Hardware
from hetswarm.protocol.units import BYTES_PER_GIB

logger = logging.getLogger(__name__)


def default_cache_path() -> Path:
    """Where measured throughputs are cached, read from the environment when asked, not when this module is
    imported: a process forked with this module loaded (client/local/preimported.py) then sets its own."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hetswarm" / "throughput.json"


def resolve_device(device: str | None) -> torch.device:
    """The device to train on: the one asked for, else CUDA when present, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise HetswarmError(f"bad --device {device!r}: {e}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise HetswarmError(f"--device {device} asked for, but this torch build sees no CUDA device")
    return resolved


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU x{torch.get_num_threads()} threads"


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs (what training uses under autocast), fp32 on the CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / BYTES_PER_GIB
    return psutil.virtual_memory().total / BYTES_PER_GIB


def measure_tflops(device: torch.device, dtype: torch.dtype, *, size: int | None = None, repeats: int = 5) -> float:
    """Dense matmul throughput, warm-up excluded and the device synchronized around the timed calls."""
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up: kernels, allocator, thread pool
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    return 2 * size**3 * repeats / elapsed / 1e12


def cache_key(device: torch.device) -> str:
    """The key of `device`'s throughput in the cache: its name and compute dtype ("NVIDIA H100|bfloat16")."""
    return f"{device_name(device)}|{compute_dtype(device)}".replace("torch.", "")


def probe_hardware(device: torch.device, *, throughput: str = "auto", cache_path: Path | None = None) -> Hardware:
    """This peer's Hardware record; `throughput` is "auto" (cached when known) or "eval" (measure again);
    `cache_path` is `default_cache_path()` unless given."""
    if throughput not in ("auto", "eval"):
        raise HetswarmError(f"--throughput must be auto or eval, got {throughput!r}")
    name, dtype, key = device_name(device), compute_dtype(device), cache_key(device)
    cache_path = cache_path or default_cache_path()
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # peers started together on one machine measure one at a time
        cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
        if throughput == "eval" or key not in cache:
            logger.info(f"Measuring matmul throughput of {name} in {dtype}")
            cache[key] = measure_tflops(device, dtype)
            cache_path.write_text(json.dumps(cache, indent=1))
        tflops = cache[key]
    logger.info(f"{name}: {tflops:.2f} TFLOPS ({dtype}), {memory_gib(device):.1f} GiB")
    return Hardware(
        device=str(device), device_name=name[:128], tflops=float(tflops),
        dtype=str(dtype).removeprefix("torch."), memory_gib=float(memory_gib(device)),
    )


def emulate_tflops(hardware: Hardware, tflops: float) -> Hardware:
    """The record of a slower device than this one (`hetswarm join --emulate-tflops`: one machine runs a swarm of
    mixed GPUs); the stage worker then pads every computation to as long as on that device.

    Raises:
        HetswarmError: `tflops` is not positive, or not below what this device measured (it cannot be sped up).
    """
    if not 0 < tflops < hardware.tflops:
        raise HetswarmError(f"--emulate-tflops must be above 0 and below this device's measured {hardware.tflops:.3g} "
                            f"TFLOPS (a device can be slowed down, not sped up), got {tflops:g}")
    logger.info(f"Emulating a {tflops:g}-TFLOPS device: every computation takes as long as its FLOPs would there "
                f"(this device measured {hardware.tflops:.3g})")
    return hardware.copy(update={"tflops": float(tflops)})