"""``commtax bench ddp``: a small GPT trained with DDP under each communication hook, measured and predicted.

The model is the commtax ``Model`` it is predicted as (pre-norm GPT blocks without biases,
LayerNorm weights only, MLP 4h with GELU, untied input and output embeddings, a final norm;
no positional embedding: the synthetic task does not need one), so ``estimate`` sees the same
parameter count and GEMM shapes. The task is next-token prediction on a fixed random Markov
chain (each token has ``SUCCESSORS`` equally likely successors: the best achievable loss is
ln 4 = 1.386 nats), fixed seed, the same batches for every hook.

Per step (after ``warmup`` steps): ``accumulate`` micro-batches, the first ``accumulate − 1``
under ``no_sync`` (gradients accumulate locally, no communication), then the optimizer. The
step time is the slowest rank's median. ``exposed_comm_s`` is that median minus the step without
communication: the median of ``compute_steps`` forward/backward passes with every micro-batch
under ``no_sync``, each run right after a training step (same time window, same host load),
plus the optimizer's median. Bytes on the wire
are counted (``hooks.WireCounter``) over the timed steps, per rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from commtax.measure.hooks import HOOKS, WireCounter, hook_format, make_hook

SUCCESSORS = 4


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 512
    hidden: int = 256
    layers: int = 2
    heads: int = 4
    seq_len: int = 64

    def model_spec(self) -> dict:
        """The commtax ``Model`` this network is (spec.Model fields)."""
        return {
            "name": f"tiny-gpt-{self.layers}x{self.hidden}",
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "vocab": self.vocab,
            "gated_mlp": False,
            "tied_embeddings": False,
            "source": "commtax.measure.ddp_bench.TinyGPT",
        }


@dataclass(frozen=True)
class DDPBenchConfig:
    hooks: tuple[str, ...] = ("none",)
    error_feedback: bool = False
    stochastic: bool = False
    bucket_mb: float = 25.0
    accumulate: int = 1
    steps: int = 20
    warmup: int = 3
    compute_steps: int = 10  # no-communication twins of the first training steps
    micro_batch: int = 8
    lr: float = 3e-3
    optimizer: str = "adamw"  # adamw | sgd (momentum 0.9): SGD shows quantization bias that Adam's normalisation hides
    powersgd_rank: int = 4
    seed: int = 0
    timeout_s: float = 300.0
    model: GPTConfig = GPTConfig()


class Block(nn.Module):
    def __init__(self, h: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(h, bias=False), nn.LayerNorm(h, bias=False)
        self.qkv, self.proj = nn.Linear(h, 3 * h, bias=False), nn.Linear(h, h, bias=False)
        self.up, self.down = nn.Linear(h, 4 * h, bias=False), nn.Linear(4 * h, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c.hidden, c.heads) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.hidden, bias=False)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def transition_table(vocab: int, seed: int) -> torch.Tensor:
    """Each token's SUCCESSORS possible next tokens (vocab × SUCCESSORS), fixed by the seed.

    Successors are drawn with Zipf(1) probabilities (p_k ∝ 1/k), so token frequencies are
    heavy-tailed as in natural text: rare tokens' gradients are small beside frequent ones' —
    the case where rounding small values to zero (int4) loses information and error feedback matters.
    """
    g = torch.Generator().manual_seed(seed)
    zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    perm = torch.randperm(vocab, generator=g)
    picks = torch.multinomial(zipf.expand(vocab, vocab), SUCCESSORS, replacement=True, generator=g)
    return perm[picks]


def batch(table: torch.Tensor, micro_batch: int, seq_len: int, g: torch.Generator) -> torch.Tensor:
    """micro_batch sequences of seq_len + 1 tokens walking the chain from random starts."""
    vocab = table.shape[0]
    out = torch.empty(micro_batch, seq_len + 1, dtype=torch.long)
    out[:, 0] = torch.randint(0, vocab, (micro_batch,), generator=g)
    for t in range(seq_len):
        pick = torch.randint(0, SUCCESSORS, (micro_batch,), generator=g)
        out[:, t + 1] = table[out[:, t], pick]
    return out


def params_of(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Trainee:
    """One hook's model, DDP wrapper, optimizer, data stream, wire counter and timings on this rank."""

    def __init__(self, cfg: DDPBenchConfig, hook: str, group=None):
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.cfg, self.hook, self.group = cfg, hook, group
        torch.manual_seed(cfg.seed)  # every hook starts from the same weights …
        self.model = TinyGPT(cfg.model)
        self.ddp = DDP(self.model, bucket_cap_mb=cfg.bucket_mb, process_group=group)
        fn, state = make_hook(hook, group, cfg.error_feedback, cfg.stochastic, cfg.powersgd_rank, seed=cfg.seed)
        self.ddp.register_comm_hook(state, fn)
        if cfg.optimizer == "sgd":
            self.opt = torch.optim.SGD(self.ddp.parameters(), lr=cfg.lr, momentum=0.9)
        else:
            self.opt = torch.optim.AdamW(self.ddp.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.table = transition_table(cfg.model.vocab, cfg.seed)
        self.data = torch.Generator().manual_seed(cfg.seed * 7919 + dist.get_rank())  # … and sees the same batches
        self.spare = torch.Generator().manual_seed(cfg.seed * 7919 + dist.get_rank() + 104_729)  # compute-only steps
        self.counter = WireCounter()
        self.losses: list[float] = []
        self.step_s: list[float] = []
        self.compute_s: list[float] = []
        self.opt_s: list[float] = []

    def step(self, timed: bool = False) -> None:
        """One optimizer step of ``accumulate`` micro-batches, the first accumulate − 1 under no_sync."""
        cfg, ddp = self.cfg, self.ddp
        t0 = time.perf_counter()
        total = 0.0
        for k in range(cfg.accumulate):
            xy = batch(self.table, cfg.micro_batch, cfg.model.seq_len, self.data)
            with contextlib.nullcontext() if k == cfg.accumulate - 1 else ddp.no_sync():
                logits = ddp(xy[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), xy[:, 1:].reshape(-1))
                (loss / cfg.accumulate).backward()
            total += float(loss.detach()) / cfg.accumulate
        t1 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if timed:
            self.step_s.append(time.perf_counter() - t0)
            self.opt_s.append(time.perf_counter() - t1)
        self.losses.append(total)

    def compute_only(self) -> None:
        """The same forward and backward work with every micro-batch under no_sync (no communication), on
        batches of a separate stream, gradients dropped: training is unchanged. Its time + the optimizer's
        median is the step without communication."""
        cfg, ddp = self.cfg, self.ddp
        t0 = time.perf_counter()
        with ddp.no_sync():
            for _ in range(cfg.accumulate):
                xy = batch(self.table, cfg.micro_batch, cfg.model.seq_len, self.spare)
                logits = ddp(xy[:, :-1])
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), xy[:, 1:].reshape(-1)).backward()
        self.compute_s.append(time.perf_counter() - t0)
        self.opt.zero_grad(set_to_none=True)

    def record(self) -> dict:
        """The record (collective: every rank calls it in the same order)."""
        cfg, n = self.cfg, dist.get_world_size()
        dts, comp = torch.tensor(self.step_s, dtype=torch.float64), torch.tensor(self.compute_s, dtype=torch.float64)
        opt = torch.tensor(self.opt_s, dtype=torch.float64).median()
        maxed = torch.stack([dts.median(), comp.median() + opt, dts.mean()])
        dist.all_reduce(maxed, op=dist.ReduceOp.MAX, group=self.group)  # the slowest rank sets the pace
        curve = torch.tensor(self.losses, dtype=torch.float64)
        dist.all_reduce(curve, group=self.group)
        curve /= n
        step_s, compute_s, mean_s = (float(v) for v in maxed)
        return {
            "hook": self.hook,
            "format": hook_format(self.hook, cfg.powersgd_rank),
            "error_feedback": cfg.error_feedback,
            "stochastic": cfg.stochastic,
            "optimizer": cfg.optimizer,
            "lr": cfg.lr,
            "bucket_mb": cfg.bucket_mb,
            "accumulate": cfg.accumulate,
            "steps": cfg.steps,
            "world_size": n,
            "nodes": n // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            "ranks_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            "backend": dist.get_backend(self.group),
            "params": params_of(self.model),
            "micro_batch": cfg.micro_batch,
            "seq_len": cfg.model.seq_len,
            "step_time_s": step_s,
            "step_time_mean_s": mean_s,
            "compute_step_s": compute_s,
            "exposed_comm_s": max(0.0, step_s - compute_s),
            "wire_bytes_per_step": self.counter.wire_bytes(n) / cfg.steps,
            "message_bytes_per_step": self.counter.message_bytes() / cfg.steps,
            "loss": float(curve[-5:].mean()),
            "loss_curve": [float(v) for v in curve],
            "model": cfg.model.model_spec(),
            "unix_time": time.time(),
        }


def train_all(cfg: DDPBenchConfig, group=None, dog=None) -> list[dict]:
    """Every hook, interleaved step by step (hook A step i, its compute-only step, hook B step i, …) so a
    busy host slows all alike and each hook's step and its no-communication twin share a time window."""
    trainees = [Trainee(cfg, h, group) for h in cfg.hooks]
    for _ in range(cfg.warmup):
        for t in trainees:
            t.step()
    dist.barrier(group)
    for i in range(cfg.steps):
        for t in trainees:
            if dog is not None:
                dog.step(i, f"bench ddp --hook {t.hook} step {i}")
            # ranks start each timed step together, as the last step's reduction lines them up in a DDP job; else
            # the skew the interleaved steps leave (twins and other hooks end at different times) is timed as comm
            dist.barrier(group)
            with t.counter.patch():
                t.step(timed=True)
            if i < cfg.compute_steps:
                t.compute_only()
    if dog is not None:
        dog.disarm()
    return [t.record() for t in trainees]


# ----------------------------------------------------------------------------- prediction
def predict(
    record: dict,
    cluster: dict,
    gemm: list[dict] | None = None,
    mem_bw_GBps: float | None = None,
    convert_Gelem_s: dict[str, float] | None = None,
) -> dict:
    """What ``commtax.schedule.analytical`` predicts for the record's model, plan and cluster file (torch-free).

    Compute is calibrated on the same machine: matmul efficiency from a ``bench gemm`` at the model's
    shapes (the median over GEMMs of achieved / (peak × the model's shape factors), so the model
    reproduces the measured GEMMs), memory bandwidth = a measured copy bandwidth, fp32↔fp8 conversion rates
    measured with torch (``convert_Gelem_s``: scalar code on CPU, slower than memory), and one
    compute unit per rank (``sms: 1``: a CPU rank runs one GEMM tile at a time with OMP_NUM_THREADS=1,
    so GPU wave quantisation does not apply).
    """
    from commtax.costs.compute import quantisation_efficiency, short_k_efficiency
    from commtax.costs.pricing import Costs
    from commtax.schedule.analytical import estimate
    from commtax.spec import Job, build, load_catalog, resolve_cluster
    from commtax.workload.step import build_workload, grad_bytes_per_param

    gpu = dict(cluster["gpu"])
    gpu["sms"] = 1
    if gemm:
        # invert compute.gemm_efficiency at each measured shape, so the model reproduces the measured GEMMs: the rate
        # a shape-free GEMM would need, x = achieved / shape factors; the peak is raised to the largest x where the
        # cluster file's placeholder is lower (an efficiency above 1 would be clipped), the efficiency is median(x)/peak
        x = sorted(
            g["tflops"] / (short_k_efficiency(g["k"]) * quantisation_efficiency(g["m"], g["n"], 1)) for g in gemm
        )
        peak = max(gpu["peak_tflops"]["fp32"], x[-1])
        gpu["peak_tflops"] = {**gpu["peak_tflops"], "fp32": peak}
        gpu["matmul_efficiency"] = {"fp32": x[len(x) // 2] / peak}
    if mem_bw_GBps:
        gpu["mem_bw_GBps"] = mem_bw_GBps
    if convert_Gelem_s:
        gpu["convert_Gelem_s"] = convert_Gelem_s
    n, acc, mb = record["world_size"], record["accumulate"], record["micro_batch"]
    c = resolve_cluster(
        {**cluster, "gpu": gpu, "num_gpus": n, "gpus_per_node": record["ranks_per_node"]}, load_catalog()
    )
    job = build(
        Job,
        {
            "model": record["model"],
            "cluster": c,
            "plan": {
                "framework": "pytorch-ddp",
                "tp": 1,
                "pp": 1,
                "dp": n,
                "zero": 0,
                "micro_batch": mb,
                "recompute": "none",
                "grad_comm_dtype": record["format"],
                "grad_error_feedback": bool(record.get("error_feedback")),
                "overlap": {"dp": True},
            },
            "training": {"seq_len": record["seq_len"], "global_batch": n * mb * acc, "precision": "fp32"},
        },
        "bench ddp",
    )
    # DDP's bucket_cap_mb counts fp32 gradient bytes; on the wire a bucket is b/4 of that
    wire_bucket = record["bucket_mb"] * 2**20 * grad_bytes_per_param(job) / 4
    wl = dataclasses.replace(build_workload(job), bucket_bytes=wire_bucket)
    b = estimate(job, workload=wl)
    # the codec (quantize/dequantize passes, PowerSGD's GEMMs) is inside the estimate (Workload.dp_codec); its part
    costs = Costs(job)
    return {
        "predicted_step_time_s": b.step_time_s,
        "predicted_exposed_comm_s": b.breakdown_s.get("dp_exposed", 0.0),
        "predicted_breakdown_s": dict(b.breakdown_s),
        "predicted_codec_s": sum(costs.compute(op) for op in wl.dp_codec),
    }


def median_seconds(
    run: Callable[[], object], iters: int, warmup: int = 1, before: Callable[[], object] | None = None
) -> float:
    """Median wall time of ``run()`` over ``iters`` timed calls, after ``warmup`` untimed ones; ``before()`` runs
    untimed ahead of each timed call."""
    for _ in range(warmup):
        run()
    ts = []
    for _ in range(iters):
        if before is not None:
            before()
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def memcpy_bw_GBps(nbytes: int = 64 * 2**20, iters: int = 5) -> float:
    """Read + write bandwidth of a large tensor copy on this rank (the roofline's memory term), GB/s."""
    a = torch.ones(nbytes // 4)
    b = torch.empty_like(a)
    return 2 * nbytes / median_seconds(lambda: b.copy_(a), iters) / 1e9


LLC_FLUSH_BYTES = 256 * 2**20  # larger than any last-level cache the bench runs on


def calibrate_compute(cfg: DDPBenchConfig, warmup: int = 1, iters: int = 7) -> dict:
    """This rank's GEMM throughput at the model's own shapes, measured now, and its copy bandwidth.

    The ``bench gemm`` shapes of one layer (hidden h, micro_batch·seq tokens: QKV, attention out,
    MLP up, down), each as the workload charges it: forward (m×k)·(k×n), dgrad (m×n)·(n×k) and
    wgrad (k×m)·(m×n) with the transposed operand autograd passes (commtax.workload.step._layer_block).
    The slowest rank's times (MAX) are kept: it sets the pace of a DDP step.
    """
    from commtax.measure.gemm import gemm_shapes

    # each GEMM timed alone after a write that evicts the last-level cache (as triton.testing.do_bench zeroes a
    # 256 MB buffer before each run): inside a training step a GEMM's operands were last touched by other ops, not
    # by the same GEMM a moment ago (measured on this 48 MiB-L3 host: warm repeats ran ~10% faster than cold ones)
    flush = torch.empty(LLC_FLUSH_BYTES // 4)
    recs = []
    for name, (m, n, k) in gemm_shapes(cfg.model.hidden, cfg.micro_batch * cfg.model.seq_len).items():
        x, w, dy = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
        for kind, run, shape in (
            ("fwd", lambda x=x, w=w: x @ w, (m, n, k)),
            ("dgrad", lambda dy=dy, w=w: dy @ w.t(), (m, k, n)),
            ("wgrad", lambda x=x, dy=dy: x.t() @ dy, (k, n, m)),
        ):
            t = median_seconds(run, iters, warmup, before=flush.zero_)
            recs.append(
                {
                    "op": "gemm",
                    "name": f"{name}_{kind}",
                    "m": shape[0],
                    "n": shape[1],
                    "k": shape[2],
                    "dtype": "fp32",
                    "flop": 2 * m * n * k,
                    "time_s": t,
                }
            )
    conv = convert_seconds_per_elem()
    times = torch.tensor(
        [r["time_s"] for r in recs] + list(conv.values()) + [1.0 / memcpy_bw_GBps()], dtype=torch.float64
    )
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    for r, t in zip(recs, times[: len(recs)].tolist()):
        r["time_s"], r["tflops"] = t, r["flop"] / t / 1e12
    rates = {c: 1e-9 / t for c, t in zip(conv, times[len(recs) : -1].tolist())}
    return {"gemm": recs, "mem_bw_GBps": 1.0 / float(times[-1]), "convert_Gelem_s": rates}


def convert_seconds_per_elem(numel: int = 2**21, iters: int = 5) -> dict[str, float]:
    """Seconds per element of each fp32↔fp8 conversion (comm_dtypes.CONVERSIONS) with torch on this rank, median."""
    from commtax.measure.compression import FP8_DTYPES
    from commtax.spec.wire_dtypes import CONVERSIONS

    x = torch.randn(numel)
    out = {}
    for c in CONVERSIONS:
        src, dst = c.split("->")
        a = x if src == "fp32" else x.to(FP8_DTYPES[src])
        dtype = torch.float32 if dst == "fp32" else FP8_DTYPES[dst]
        out[c] = median_seconds(lambda a=a, dtype=dtype: a.to(dtype), iters) / numel
    return out


def codec_times(cfg: DDPBenchConfig, numel: int) -> dict[str, float | None]:
    """Each hook's own compute on a gradient of ``numel`` elements (hooks.codec_seconds), slowest rank."""
    from commtax.measure.hooks import codec_seconds

    n = dist.get_world_size()
    raw = {h: codec_seconds(h, numel, n, cfg.error_feedback) for h in cfg.hooks}
    t = torch.tensor([-1.0 if v is None else v for v in raw.values()], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {h: (None if v < 0 else float(v)) for h, v in zip(raw, t.tolist())}


def merge_calibrations(a: dict, b: dict) -> dict:
    """The mean of two calibrations (before and after the run), GEMM by GEMM."""
    gemm = [
        {**x, "time_s": (x["time_s"] + y["time_s"]) / 2, "tflops": 2 * x["flop"] / (x["time_s"] + y["time_s"]) / 1e12}
        for x, y in zip(a["gemm"], b["gemm"])
    ]
    conv = {c: 2 / (1 / a["convert_Gelem_s"][c] + 1 / b["convert_Gelem_s"][c]) for c in a["convert_Gelem_s"]}
    return {"gemm": gemm, "mem_bw_GBps": 2 / (1 / a["mem_bw_GBps"] + 1 / b["mem_bw_GBps"]), "convert_Gelem_s": conv}


def _where() -> str:
    return (
        f"node {os.environ.get('GROUP_RANK', '?')}, local rank {os.environ.get('LOCAL_RANK', '?')}, "
        f"{socket.gethostname()} pid {os.getpid()}"
    )


def run(
    cfg: DDPBenchConfig, sink, cluster: dict | None = None, gemm: list[dict] | None = None, log=print
) -> list[dict]:
    """Under torchrun: all hooks, interleaved; rank 0 appends the records (with the prediction) to ``sink``."""
    from commtax.measure.bench import init_distributed
    from commtax.measure.watchdog import Watchdog

    for h in cfg.hooks:
        assert h in HOOKS, h
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    init_distributed("gloo", cfg.timeout_s)
    rank = dist.get_rank()
    dog = Watchdog(dist.distributed_c10d._get_default_store(), rank, dist.get_world_size(), cfg.timeout_s, _where())
    calib = calibrate_compute(cfg) if cluster is not None else None
    out = train_all(cfg, dog=dog)
    if calib is not None:  # again after training: the host's load may have changed meanwhile
        calib = merge_calibrations(calib, calibrate_compute(cfg))
    codec = codec_times(cfg, out[0]["params"])
    for rec in out:
        rec["codec_s"] = codec[rec["hook"]]
        if cluster is not None:
            rec.update(predict(rec, cluster, gemm or calib["gemm"], calib["mem_bw_GBps"], calib["convert_Gelem_s"]))
            rec["calibration"] = {
                "mem_bw_GBps": calib["mem_bw_GBps"],
                "convert_Gelem_s": calib["convert_Gelem_s"],
                "gemm_tflops": [g["tflops"] for g in gemm or calib["gemm"]],
                "gemm_source": "--gemm file" if gemm else "measured in this run, before and after",
            }
        if rank == 0:
            sink.append(rec)
            pred = f" predicted {rec['predicted_step_time_s'] * 1e3:8.1f} ms" if "predicted_step_time_s" in rec else ""
            if rec.get("predicted_codec_s"):
                alone = f"{rec['codec_s'] * 1e3:.1f} ms" if rec["codec_s"] is not None else "not replayed"
                pred += f" (codec {rec['predicted_codec_s'] * 1e3:.1f} ms of it; measured alone {alone})"
            log(
                f"{rec['hook']:>9}{' +EF' if cfg.error_feedback else ''}: step {rec['step_time_s'] * 1e3:8.1f} ms"
                f"{pred}, exposed comm {rec['exposed_comm_s'] * 1e3:7.1f} ms, "
                f"wire {rec['wire_bytes_per_step'] / 1e6:7.3f} MB/step, loss {rec['loss']:.3f}"
            )
    dog.stop()
    dist.barrier()
    dist.destroy_process_group()
    return out


def config_dict(cfg: DDPBenchConfig) -> dict:
    return asdict(cfg)


def entropy_floor() -> float:
    """The best achievable loss of the task: ln SUCCESSORS nats."""
    return math.log(SUCCESSORS)
