"""Does a swarm train a Llama as a single process does: tokens per second and held-out loss, on this machine.

The built-in corpus is cut into paragraph documents and prepared with a 512-token byte-level BPE (`hetswarm data
prepare`). A Llama of about 13 M parameters (8 layers, d 384, 6 heads, 2 key/value heads, SwiGLU 1024) trains for
`--steps` steps of 8 × 128 tokens in two ways from the same seed-built weights on the same batches:

* the swarm: a coordinator (`--model` this config, `--data` pinned, checkpoints at the last step) and 4 `hetswarm
  join` processes as 2 pipelines × 2 stages under the world-wide link emulation (Oregon, Virginia, Ohio, London);
  its tokens per second are the step's tokens over the slowest client's summed step wall times; its model is
  `hetswarm export`-ed from the clients' checkpoints;
* one process: transformers' LlamaForCausalLM with the same AdamW settings (StageConfig.build_optimizer), the
  whole step's sequences in one batch.

Both exports are scored by transformers on the same windows of the validation split. Memory per stage: the
parameters and AdamW state the cost model counts (16 bytes a parameter) and each client's resident set at the end.
Bounded: every wait gives up after `--timeout` seconds. Writes the "llama-swarm" section of benchmarks/RESULTS.md.

    python benchmarks/llama_swarm.py [--steps 60] [--timeout 1200]
"""
from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import psutil
import torch
from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script
from transformers import AutoModelForCausalLM

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.training.checkpoints import CheckpointDir, newest_whole_model
from hetswarm.client.training.data import TokenSource, default_corpus
from hetswarm.client.training.hf_folder import export_folder
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.prepared_data import PreparedData, prepare
from hetswarm.client.training.reference import step_batches
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.model_config import ModelConfig

SWARM, SEED = "llama-bench", 0
SITES = {"oregon": "Oregon", "virginia": "Virginia", "ohio": "Ohio", "london": "London"}
STEP_WALL = re.compile(r"step (\d+): .*wall ([0-9.]+) s")
EVAL_WINDOWS = 64


def model_config(data: PreparedData) -> ModelConfig:
    return ModelConfig(name="llama-13m", architecture="llama", n_layers=8, d_model=384, n_heads=6, n_kv_heads=2,
                       d_ff=1024, vocab_size=data.vocab_size, seq_len=128, batch_tokens=8 * 128, micro_batches=2,
                       data_digest=data.digest)


def prepared_corpus(folder: Path) -> PreparedData:
    documents = folder / "corpus.jsonl"
    documents.write_text("".join(json.dumps({"text": paragraph}) + "\n"
                                 for paragraph in default_corpus().decode().split("\n\n")))
    return prepare([documents], folder / "data", train_vocab=512, validation_every=20)


def train_swarm(model: ModelConfig, data: PreparedData, folder: Path, *, steps: int, timeout_s: float
                ) -> tuple[Path, float, list[float]]:
    """(exported folder, tokens per second, each client's resident MiB at the end)."""
    config_file = folder / "model.json"
    config_file.write_text(json.dumps(model.to_dict()))
    (folder / "swarm").mkdir()
    with LocalSwarm(SWARM, workdir=folder / "swarm") as swarm:
        swarm.start_coordinator("coordinator", "--model", str(config_file), "--data", str(data.folder), "--dp", "2",
                                "--pp", "2", "--min-peers", "4", "--debounce", "1", "--time-budget", "1",
                                "--reconsider", "3600", "--checkpoint-every", str(steps), "--seed", str(SEED))
        clients = {name: swarm.start_client(name, "--coordinator", swarm.coordinator_id, "--data", str(data.folder),
                                            "--max-steps", str(steps), "--torch-threads", "1", "--emulate",
                                            "worldwide", "--site", site, "--checkpoint-dir",
                                            str(folder / "checkpoints" / name))
                   for name, site in SITES.items()}
        for client in clients.values():
            client.wait_for(re.compile(f"Reached step {steps}"), timeout_s)
        walls = [sum(float(wall) for _, wall in STEP_WALL.findall(client.output())) for client in clients.values()]
        resident = [psutil.Process(client.process.pid).memory_info().rss / 2**20 for client in clients.values()]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(list((folder / "checkpoints").rglob("*.json"))) < 2:
            time.sleep(1)  # the savers' checkpoints are written in the background
    trained, state = newest_whole_model([CheckpointDir(folder / "checkpoints" / name, SWARM) for name in SITES])
    if state.step != steps:
        raise RuntimeError(f"the clients' checkpoints hold step {state.step} whole, not {steps}")
    parameters = {name: tensor for name, tensor in state.tensors.items() if ":" not in name}  # as `hetswarm export`
    return export_folder(trained, parameters, folder / "swarm-export", data), steps * model.batch_tokens / max(walls), \
        resident


def train_one_process(model: ModelConfig, data: PreparedData, folder: Path, *, steps: int) -> tuple[Path, float]:
    """transformers in this process from the swarm's initial weights: (exported folder, tokens per second)."""
    start = export_folder(model, build_full_model(model, seed=SEED).state_dict(), folder / "initial", data)
    hf = AutoModelForCausalLM.from_pretrained(start).train()
    optimizer = StageConfig().build_optimizer(hf.parameters())
    source = TokenSource.from_path(data.folder, seed=SEED)
    elapsed = 0.0
    for step in range(steps):
        batches = step_batches(source, model, step=step, n_pipelines=2)
        inputs = torch.cat([x for pipeline in batches for x, _ in pipeline])
        targets = torch.cat([y for pipeline in batches for _, y in pipeline])
        started = time.perf_counter()
        logits = hf(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        elapsed += time.perf_counter() - started
    out = folder / "one-process"
    hf.save_pretrained(out)
    return out, steps * model.batch_tokens / elapsed


@torch.no_grad()
def held_out_loss(folder: Path, data: PreparedData, seq_len: int) -> float:
    """Mean next-token loss of the model in `folder` over EVAL_WINDOWS evenly spaced windows of the validation split."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokens = data.split("validation")
    starts = torch.linspace(0, len(tokens) - seq_len - 2, EVAL_WINDOWS).long()
    rows = torch.stack([torch.from_numpy(tokens[s:s + seq_len + 1].astype("int64")) for s in starts.tolist()])
    return float(model(input_ids=rows[:, :-1], labels=rows[:, :-1]).loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=1200.0, help="give up on any wait after this many seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llama-swarm-") as tmp:
        folder = Path(tmp)
        data = prepared_corpus(folder)
        model = model_config(data)
        print(f"{model.total_params / 1e6:.1f} M parameters; data {data.digest[:12]}…", flush=True)
        started = time.monotonic()
        swarm_out, swarm_rate, resident = train_swarm(model, data, folder, steps=args.steps, timeout_s=args.timeout)
        swarm_minutes = (time.monotonic() - started) / 60
        single_out, single_rate = train_one_process(model, data, folder, steps=args.steps)
        swarm_loss = held_out_loss(swarm_out, data, model.seq_len)
        single_loss = held_out_loss(single_out, data, model.seq_len)
        initial_loss = held_out_loss(folder / "initial", data, model.seq_len)
    stages = [model.params_of(b - a, first=s == 0, last=s == 1) for s, (a, b) in enumerate(model.stage_layers(2))]
    gap = swarm_loss / single_loss - 1
    markdown = f"""## Llama swarm: tokens per second and held-out loss against transformers in one process

Command: `{command_line()}` on the project's 2-core CPU machine (4 clients share its 2 cores; the single process
has them to itself), {swarm_minutes:.1f} min for the swarm. {model.total_params / 1e6:.1f} M parameters (8 layers,
d 384, 6 heads, 2 KV heads, SwiGLU 1024, vocabulary {model.vocab_size}), {args.steps} steps of
{model.batch_tokens} tokens, AdamW lr {StageConfig().lr}, from the same seed-built weights on the same batches.

| | tokens / s | held-out loss after {args.steps} steps (from {initial_loss:.3f}) |
|---|---|---|
| swarm: 2 pipelines × 2 stages, world-wide emulated links | {swarm_rate:.0f} | {swarm_loss:.4f} |
| transformers, one process | {single_rate:.0f} | {single_loss:.4f} |

Ratio swarm / one process: {swarm_rate / single_rate:.2f}× tokens per second; held-out loss {gap:+.2%} (target
within 2 %: {'met' if abs(gap) <= 0.02 else 'MISSED'}). Memory per stage: parameters and AdamW state
{', '.join(f'{16 * p / 2**20:.0f} MiB' for p in stages)} (stages 0, 1); each client's resident set at the end
{', '.join(f'{r:.0f} MiB' for r in resident)} (the client process with Python and torch; its DHT child not counted).
"""
    print(markdown)
    write_section("llama-swarm", markdown)


if __name__ == "__main__":
    main()
