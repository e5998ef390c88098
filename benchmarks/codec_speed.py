"""How fast each wire codec encodes and decodes (protocol/codecs.py), on the CPU and, where there is one, on a GPU.

A GPU stage's frames are encoded where its tensors live: the blockwise codecs quantize on the device and copy only
their scales and levels to the host, fp16 casts before the copy. A receiver decodes on its CPU (the frame reader
checks the bytes there). Throughput counts the float32 values in, as GB/s, whatever the codec sends, so rows compare;
each figure is the median of timed calls after a warm-up. Sizes: one micro-batch of activations of
benchmarks/llama_swarm.py's 13 M model (2 sequences of 128 tokens, d_model 384) and of llama-1.1b (4 sequences of 2048
tokens, d_model 2048, benchmarks/gpu_stage.py's). Writes the "codec-speed" section of benchmarks/RESULTS.md.

    python benchmarks/codec_speed.py [--json FILE] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.peer.hardware import device_name
from hetswarm.protocol.codecs import decode_tensor, encode_tensor, wire_bytes
from hetswarm.protocol.wire_format import Codec

CODECS: tuple[Codec, ...] = ("fp16", "8bit", "4bit", "2bit")
SHAPES = {"llama-13m micro-batch": (2, 128, 384), "llama-1.1b micro-batch": (4, 2048, 2048)}
MIN_CALLS, MAX_CALLS, MIN_SECONDS = 3, 50, 0.5
"""Each figure times at least MIN_CALLS calls and goes on to MAX_CALLS until MIN_SECONDS have passed."""


@dataclass(frozen=True)
class CodecSpeed:
    where: str
    tensor: str
    codec: str
    values_m: float
    wire_mb: float
    encode_ms: float
    encode_gb_s: float
    decode_ms: float
    decode_gb_s: float


def median_seconds(call, *, synchronize=lambda: None) -> float:
    call()  # warm-up: kernels, the allocator
    synchronize()
    times, started = [], time.perf_counter()
    while len(times) < MIN_CALLS or (len(times) < MAX_CALLS and time.perf_counter() - started < MIN_SECONDS):
        begun = time.perf_counter()
        call()
        synchronize()
        times.append(time.perf_counter() - begun)
    return statistics.median(times)


def measure(device: torch.device, name: str, shape: tuple[int, ...], codec: Codec) -> CodecSpeed:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device)
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    encode_s = median_seconds(lambda: encode_tensor(x, codec), synchronize=synchronize)
    message = encode_tensor(x, codec)
    decode_s = median_seconds(lambda: decode_tensor(message, codec))
    gigabytes = 4 * x.numel() / 1e9
    return CodecSpeed(where=device_name(device), tensor=name, codec=codec, values_m=x.numel() / 1e6,
                      wire_mb=wire_bytes(codec, x.numel()) / 1e6, encode_ms=encode_s * 1e3,
                      encode_gb_s=gigabytes / encode_s, decode_ms=decode_s * 1e3, decode_gb_s=gigabytes / decode_s)


def markdown(rows: list[CodecSpeed], minutes: float) -> str:
    lines = ["## Wire codecs: encode and decode throughput, CPU and GPU", "",
             f"Command: `{command_line()}` ({minutes:.1f} min). GB/s count the float32 values in (4 bytes each); "
             "encode starts from the tensor on its device and ends with the wire bytes on the host; decode is on the "
             "host, where a receiver's frame reader decodes. Median of timed calls after a warm-up.", "",
             "| encoded on | tensor | codec | values | wire | encode | encode GB/s | decode (host) | decode GB/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.where} | {r.tensor} | {r.codec} | {r.values_m:.2f} M | {r.wire_mb:.2f} MB | "
              f"{r.encode_ms:.2f} ms | {r.encode_gb_s:.2f} | {r.decode_ms:.2f} ms | {r.decode_gb_s:.2f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--smoke", action="store_true", help="the small tensor only, nothing written")
    args = parser.parse_args()
    started = time.monotonic()
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    shapes = dict(list(SHAPES.items())[:1]) if args.smoke else SHAPES
    rows = []
    for device in devices:
        for name, shape in shapes.items():
            for codec in CODECS:
                rows.append(measure(device, name, shape, codec))
                print(rows[-1], flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    if not args.smoke:
        write_section("codec-speed", markdown(rows, (time.monotonic() - started) / 60))


if __name__ == "__main__":
    main()
