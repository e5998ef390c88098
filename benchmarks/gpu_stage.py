"""A pipeline stage on a CUDA GPU, computed as a swarm's stage computes it: tokens per second, TFLOPS and MFU beside
the TFLOPS probe, the memory one step holds under GPipe, 1F1B and recomputation against the cost model's
prediction, and what autograd saves per token against the cost model's count.

Each stage is built by build_stage (fp32 weights), runs its forward passes under bf16 autocast, takes the last
stage's loss by micro_batch_loss and steps AdamW, as client/training/stage_worker.py does, in pass_order's order;
a random gradient stands in for the next stage's. FLOPs are the cost model's (ModelConfig.flops_per_token_of:
6·params + 12·L·T·d, PaLM Appendix B); MFU divides the achieved rate by the card's dense bf16 peak (NVIDIA's
datasheets: 989 TFLOPS for the H100 and H200 SXM) and, beside it, by the rate the volunteer's probe measured.
Prediction: coordinator/scheduling/live_cost.py's StageCosts (parameters and AdamW state, and what the micro-batches in flight
keep). Needs only torch and transformers of hetswarm's dependencies; writes the card's section of
benchmarks/RESULTS.md ("gpu-stage-h100" on an H100) and its figures as JSON.

    python benchmarks/gpu_stage.py [--json FILE] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.peer.hardware import device_name, measure_tflops, memory_gib
from hetswarm.client.training.activation_memory import saved_for_backward
from hetswarm.client.training.model import StageModule, build_stage
from hetswarm.client.training.pipeline_schedule import pass_order
from hetswarm.client.training.reference import micro_batch_loss
from hetswarm.coordinator.scheduling.live_cost import StageCosts, in_flight
from hetswarm.protocol.model_config import ModelConfig, PipelineSchedule, get_model_config

SEED = 0
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
"""Dense bf16 tensor-core peaks from NVIDIA's datasheets (SXM parts), by a name the device's name contains."""

LLAMA_13M = ModelConfig(name="llama-13m", architecture="llama", n_layers=8, d_model=384, n_heads=6, n_kv_heads=2,
                        d_ff=1024, vocab_size=512, seq_len=128, batch_tokens=8 * 128, micro_batches=2)
"""benchmarks/llama_swarm.py's model (its tokenizer has 504 tokens; 512 here)."""
LLAMA_1B = ModelConfig(name="llama-1.1b", architecture="llama", n_layers=22, d_model=2048, n_heads=32, n_kv_heads=4,
                       d_ff=5632, vocab_size=32000, seq_len=2048, batch_tokens=16 * 2048, micro_batches=4)
"""TinyLlama-1.1B's shape; a pipeline's step is 4 micro-batches of 4 sequences of 2048 tokens."""


@dataclass(frozen=True)
class Throughput:
    model: str
    stage: str
    params_m: float
    micro_batch: str
    tokens_per_s: float
    tflops: float
    mfu: float | None
    of_probe: float


@dataclass(frozen=True)
class Memory:
    schedule: str
    in_flight: int
    measured_gib: float
    predicted_gib: float


@dataclass(frozen=True)
class Saved:
    model: str
    stage: str
    per_token: float
    predicted_per_token: float
    per_micro_batch: float
    predicted_per_micro_batch: float


def run_step(module: StageModule, optimizer: torch.optim.Optimizer, *, schedule: PipelineSchedule, stage: int,
             d_pp: int, micro_batches: int, rows: int) -> None:
    """One step of the stage: its passes in `schedule`'s order, then the optimizer."""
    config, device = module.config, next(module.parameters()).device
    outputs: dict[int, torch.Tensor] = {}
    for kind, m in pass_order(schedule, stage=stage, d_pp=d_pp, micro_batches=micro_batches):
        if kind == "forward":
            if module.is_first:
                x = torch.randint(config.vocab_size, (rows, config.seq_len), device=device)
            else:
                x = torch.randn(rows, config.seq_len, config.d_model, device=device, requires_grad=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                out = module(x)
            if module.is_last:
                targets = torch.randint(config.vocab_size, (rows, config.seq_len), device=device)
                out = micro_batch_loss(out, targets, micro_batches=micro_batches)
            outputs[m] = out
        else:
            out = outputs.pop(m)
            out.backward(None if module.is_last else torch.randn_like(out))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def throughput(config: ModelConfig, stage: int, d_pp: int, *, rows: int, steps: int, device: torch.device,
               peak: float | None, probe: float) -> Throughput:
    module = build_stage(config, stage, d_pp, seed=SEED, device=device)
    optimizer = torch.optim.AdamW(module.parameters())
    step = dict(schedule="1f1b", stage=stage, d_pp=d_pp, micro_batches=config.micro_batches, rows=rows)
    for _ in range(2):  # warm-up: kernels, the allocator, AdamW's state
        run_step(module, optimizer, **step)
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        run_step(module, optimizer, **step)
    synchronize(device)
    tokens_per_s = steps * config.micro_batches * rows * config.seq_len / (time.perf_counter() - started)
    a, b = module.layers
    tflops = tokens_per_s * config.flops_per_token_of(b - a, first=module.is_first, last=module.is_last) / 1e12
    del module, optimizer
    return Throughput(model=config.name, stage=f"{stage} of {d_pp} (layers {a}–{b - 1}"
                      f"{', embedding' if stage == 0 else ''}{', head' if stage == d_pp - 1 else ''})",
                      params_m=config.params_of(b - a, first=stage == 0, last=stage == d_pp - 1) / 1e6,
                      micro_batch=f"{config.micro_batches} × {rows} × {config.seq_len}", tokens_per_s=tokens_per_s,
                      tflops=tflops, mfu=tflops / peak if peak else None, of_probe=tflops / probe)


def memory(config: ModelConfig, *, d_pp: int, schedule: PipelineSchedule, recompute: bool, device: torch.device
           ) -> Memory:
    """Peak memory of a step of stage 0 (the one 1F1B spares least), one sequence per micro-batch, after a step
    that made AdamW's state; against StageCosts for the same run."""
    module = build_stage(config, 0, d_pp, seed=SEED, device=device, recompute=recompute)
    optimizer = torch.optim.AdamW(module.parameters())
    step = dict(schedule=schedule, stage=0, d_pp=d_pp, micro_batches=config.micro_batches, rows=1)
    run_step(module, optimizer, **step)
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    run_step(module, optimizer, **step)
    measured = torch.cuda.max_memory_allocated(device)
    del module, optimizer
    costs = StageCosts(config, d_pp=d_pp, d_dp=1, micro_batches=config.micro_batches, recompute=recompute,
                       schedule=schedule)
    layers = config.stage_layers(d_pp)[0][1]
    return Memory(schedule=f"{schedule}{' + recompute' if recompute else ''}",
                  in_flight=int(in_flight(schedule, d_pp=d_pp, micro_batches=config.micro_batches)[0]),
                  measured_gib=measured / 2**30, predicted_gib=float(costs.memory_bytes[0, layers]) / 2**30)


def saved(config: ModelConfig, stage: int, d_pp: int, device: torch.device) -> Saved:
    module = build_stage(config, stage, d_pp, seed=SEED, device=device)
    a, b = module.layers
    where = dict(first=module.is_first, last=module.is_last)
    measured = saved_for_backward(module, autocast=device.type == "cuda")
    return Saved(model=config.name, stage=f"{stage} of {d_pp}", per_token=measured.per_token,
                 predicted_per_token=config.activation_bytes_per_token_of(b - a, **where),
                 per_micro_batch=measured.per_micro_batch,
                 predicted_per_micro_batch=config.micro_batch_bytes_of(b - a, **where))


def markdown(name: str, probe: float, peak: float | None, rows: list[Throughput], memories: list[Memory],
             saves: list[Saved], memory_model: ModelConfig, minutes: float) -> str:
    lines = [
        f"## A stage on {name}: bf16 throughput, TFLOPS and MFU, 1F1B memory against the cost model", "",
        f"Command: `{command_line()}` on {name} ({minutes:.1f} min). The TFLOPS probe (8192² bf16 matmuls, what a "
        f"volunteer publishes) measured **{probe:.0f} TFLOPS**"
        + (f"; the datasheet's dense bf16 peak is {peak:.0f}." if peak else "."),
        "Stages run as the stage worker runs them: fp32 weights, bf16 autocast, AdamW, 1F1B order; TFLOPS count the "
        "model's FLOPs (6·params + 12·L·T·d per token), not recomputation.", "",
        "| model | stage | parameters | micro-batches × sequences × tokens | tokens / s | TFLOPS | MFU | of probe |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r.model} | {r.stage} | {r.params_m:.1f} M | {r.micro_batch} | {r.tokens_per_s:,.0f} | "
              f"{r.tflops:.1f} | {'—' if r.mfu is None else f'{r.mfu:.1%}'} | {r.of_probe:.1%} |" for r in rows]
    lines += ["", f"Memory of one step of stage 0 of {memory_model.name} cut into 4 stages "
              f"({memory_model.stage_layers(4)[0][1]} layers and the embedding), {memory_model.micro_batches} "
              f"micro-batches of one {memory_model.seq_len}-token sequence: peak allocated during the step "
              "(torch.cuda.max_memory_allocated, AdamW's state made by a step before) against StageCosts.", "",
              "| schedule | micro-batches in flight | measured peak | predicted | predicted / measured |",
              "|---|---|---|---|---|"]
    lines += [f"| {m.schedule} | {m.in_flight} | {m.measured_gib:.2f} GiB | {m.predicted_gib:.2f} GiB | "
              f"{m.predicted_gib / m.measured_gib:.3f} |" for m in memories]
    lines += ["", "What autograd saves for the backward pass on this device, under bf16 autocast "
              "(client/training/activation_memory.py), against the cost model's count "
              "(ModelConfig.activation_bytes_per_token_of and micro_batch_bytes_of; tests/test_model.py checks the "
              "same count on the CPU):", "",
              "| model | stage | bytes per token: saved | counted | bytes per micro-batch: saved | counted |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {s.model} | {s.stage} | {s.per_token:,.0f} | {s.predicted_per_token:,.0f} | "
              f"{s.per_micro_batch:,.0f} | {s.predicted_per_micro_batch:,.0f} |" for s in saves]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--smoke", action="store_true",
                        help="small shapes on whatever device there is, nothing written: checks the script itself")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        parser.error("no CUDA device: this benchmark measures a GPU (--smoke runs it small on the CPU)")
    started = time.monotonic()
    name = device_name(device)
    probe = measure_tflops(device, torch.bfloat16 if device.type == "cuda" else torch.float32,
                           size=512 if args.smoke else None)
    card = next((part for part in PEAK_BF16_TFLOPS if part in name), None)
    peak = PEAK_BF16_TFLOPS.get(card)
    print(f"{name}: {memory_gib(device):.0f} GiB, probe {probe:.1f} TFLOPS, datasheet peak {peak}", flush=True)

    small = {"n_layers": 4, "d_model": 128, "n_heads": 4, "n_kv_heads": 2, "d_ff": 256, "vocab_size": 300,
             "seq_len": 64, "batch_tokens": 8 * 64}
    big, gpt2 = (replace(LLAMA_1B, **small), replace(get_model_config("gpt-1.3b"), **small | {"n_kv_heads": None,
                 "d_ff": None})) if args.smoke else (LLAMA_1B, get_model_config("gpt-1.3b"))
    steps = 1 if args.smoke else 5
    rows = []
    for config, stage, d_pp, sequences, count in ((LLAMA_13M, 0, 2, 2, 20), (LLAMA_13M, 1, 2, 2, 20),
                                                   (LLAMA_13M, 1, 2, 16, 20), (big, 0, 2, 4, 5), (big, 1, 2, 4, 5),
                                                   (gpt2, 1, 2, 4, 5)):
        rows.append(throughput(config, stage, d_pp, rows=sequences, steps=steps if args.smoke else count,
                               device=device, peak=peak, probe=probe))
        print(rows[-1], flush=True)
    memory_model = replace(big, micro_batches=8, batch_tokens=8 * big.seq_len)
    memories = []
    if device.type == "cuda":
        for schedule, recompute in (("gpipe", False), ("1f1b", False), ("1f1b", True)):
            memories.append(memory(memory_model, d_pp=4, schedule=schedule, recompute=recompute, device=device))
            print(memories[-1], flush=True)
    saves = [saved(config, stage, d_pp, device) for config, stage, d_pp in
             ((LLAMA_13M, 0, 2), (LLAMA_13M, 1, 2), (big, 1, 4), (big, 3, 4), (gpt2, 1, 4))]
    for entry in saves:
        print(entry, flush=True)
    figures = {"device": name, "probe_tflops": probe, "peak_tflops": peak, "throughput": [asdict(r) for r in rows],
               "memory": [asdict(m) for m in memories], "saved": [asdict(s) for s in saves]}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    if not args.smoke:
        minutes = (time.monotonic() - started) / 60
        write_section(f"gpu-stage-{(card or 'gpu').lower()}",
                      markdown(name, probe, peak, rows, memories, saves, memory_model, minutes))


if __name__ == "__main__":
    main()
