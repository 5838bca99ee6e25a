"""A tiny GPT trained with torch DistributedDataParallel on CPU (gloo), profiled with torch.profiler.

    python examples/trace/tiny_ddp.py --job examples/trace/tiny_ddp.yaml --out traces/
    commtax trace traces/ --against examples/trace/tiny_ddp.yaml

The model is built from the job file (model.layers, hidden, heads, vocab, ffn 4·hidden, untied
embeddings; training.seq_len; plan.micro_batch; one micro-batch per rank per step, fp32, AdamW),
so the trace and `commtax estimate` describe the same job. One process per rank
(torch.multiprocessing, gloo over loopback, rendezvous through a file), or one rank per process
under torchrun (`commtax cluster run -- python examples/trace/tiny_ddp.py …` runs it on the
emulated cluster's shaped links); each writes OUT/rank<N>.json, a Kineto trace of --steps profiled
steps after one warm-up step.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import yaml
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, vocab: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def worker(rank: int, world: int, job: dict, out: str, steps: int, init_method: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    m, t, p = job["model"], job["training"], job["plan"]
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(TinyGPT(m["layers"], m["hidden"], m["heads"], m["vocab"]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, m["vocab"], (p.get("micro_batch", 1), t["seq_len"] + 1), generator=gen)
    path = os.path.join(out, f"rank{rank}.json")
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        record_shapes=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    )
    with prof:
        for _ in range(steps + 1):
            opt.zero_grad(set_to_none=True)
            logits = model(tokens[:, :-1])
            F.cross_entropy(logits.reshape(-1, m["vocab"]), tokens[:, 1:].reshape(-1)).backward()
            opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def run(job_file: Path, out: Path, steps: int = 5) -> list[Path]:
    job = yaml.safe_load(Path(job_file).read_text())
    world = job["cluster"]["num_gpus"]
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(world, job, str(out), steps, f"file://{os.path.join(tmp, 'rdzv')}"), nprocs=world)
    return [out / f"rank{r}.json" for r in range(world)]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", type=Path, default=Path(__file__).with_name("tiny_ddp.yaml"))
    ap.add_argument("--out", type=Path, default=Path("traces"))
    ap.add_argument("--steps", type=int, default=5, help="profiled steps (after one warm-up step)")
    a = ap.parse_args()
    if "RANK" in os.environ:  # under torchrun (e.g. `commtax cluster run -- python tiny_ddp.py …`): this is one rank
        a.out.mkdir(parents=True, exist_ok=True)
        worker(
            int(os.environ["RANK"]),
            int(os.environ["WORLD_SIZE"]),
            yaml.safe_load(a.job.read_text()),
            str(a.out),
            a.steps,
            "env://",
        )
    else:
        for f in run(a.job, a.out, a.steps):
            print(f)
