"""``commtax bench pipeline``: a small GPT split into pipeline stages over torch.distributed p2p, measured and
predicted in the same record.

One rank per stage (``--stage-layers 3,1``: stage 0 holds the embedding and 3 blocks, stage 1 one block, the final
norm, the LM head and the loss). The model is ``ddp_bench.TinyGPT`` (the commtax ``Model`` it is predicted as), the
task its Markov chain. A step runs ``micro_batches`` micro-batches under GPipe (all forwards, then all backwards)
or 1F1B (``warm-up`` forwards, then one forward and one backward in turn, then the cool-down backwards; Narayanan et
al. 2021 §2.2), activations and gradients sent with ``isend``/``irecv`` (a send never blocks the sender's compute),
then a plain SGD step. Per stage it records compute (forward + backward passes), the time blocked in ``recv``
(waiting on the neighbour: bubble and transfer), in ``send`` completion, and the optimizer; the step time is the
slowest stage's wall time, median over the timed steps.

The prediction is the analytical schedule's (``schedule.analytical``: ``pipeline_bubble`` and ``sends_exposed`` on
one ``StageTime`` per stage), with compute calibrated in the same run on each node under its own CPU share
(``cluster up --node-speed``): one block's forward and backward, the embedding's, the head and loss's and the
optimizer per parameter, timed on each rank before and after the timed steps (the host is shared: its load moves)
and averaged; a stage is its layers × the block plus its ends. A send is α + bytes / B with α and B from the
cluster file (the slower of the two nodes' links). ``host_load`` records /proc/loadavg before and after.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from commtax.measure.ddp_bench import Block, GPTConfig, batch, median_seconds, transition_table

Schedule = Literal["gpipe", "1f1b"]


@dataclass(frozen=True)
class PipelineBenchConfig:
    stage_layers: tuple[int, ...] = (2, 2)
    schedule: Schedule = "1f1b"
    micro_batches: int = 4
    micro_batch: int = 8
    steps: int = 6
    warmup: int = 2
    calibration_iters: int = 5
    lr: float = 1e-3
    seed: int = 0
    timeout_s: float = 300.0
    model: GPTConfig = field(default_factory=lambda: GPTConfig(layers=4))


def schedule_ops(schedule: Schedule, stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """The stage's passes in order: ("F", i) forward of micro-batch i, ("B", i) its backward.

    GPipe: F0 … F(m−1), B0 … B(m−1). 1F1B: min(p − s − 1, m) warm-up forwards, then F and B in turn, then the
    cool-down backwards (Megatron-LM ``forward_backward_pipelining_without_interleaving``)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        ops += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    ops += [("B", i) for i in range(b, m)]
    return ops


class Stage(nn.Module):
    """Blocks [first, first + n) of the TinyGPT, with the embedding on stage 0 and the norm and head on the last."""

    def __init__(self, c: GPTConfig, first: int, n: int, is_first: bool, is_last: bool, seed: int):
        super().__init__()
        torch.manual_seed(seed)  # every rank builds the whole model alike and keeps its slice
        embed = nn.Embedding(c.vocab, c.hidden)
        blocks = [Block(c.hidden, c.heads) for _ in range(c.layers)]
        norm, head = nn.LayerNorm(c.hidden, bias=False), nn.Linear(c.hidden, c.vocab, bias=False)
        self.embed = embed if is_first else None
        self.blocks = nn.ModuleList(blocks[first : first + n])
        self.norm, self.head = (norm, head) if is_last else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for blk in self.blocks:
            x = blk(x)
        return x

    def loss(self, y: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.norm(y))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@dataclass
class StageTimes:
    compute_s: float = 0.0
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    recv_s: float = 0.0
    send_s: float = 0.0
    optimizer_s: float = 0.0
    wall_s: float = 0.0


def run_step(stage: Stage, opt, cfg: PipelineBenchConfig, rank: int, p: int, data: list[torch.Tensor]) -> StageTimes:
    """One training step of this stage under the schedule; times by kind."""
    c, mb = cfg.model, cfg.micro_batch
    shape = (mb, c.seq_len, c.hidden)
    first, last = rank == 0, rank == p - 1
    t = StageTimes()
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    pending = []
    dist.barrier()
    t0 = time.perf_counter()
    for kind, i in schedule_ops(cfg.schedule, rank, p, cfg.micro_batches):
        if kind == "F":
            if first:
                x = data[i][:, :-1]
            else:
                x = torch.empty(shape)
                a = time.perf_counter()
                dist.irecv(x, rank - 1).wait()
                t.recv_s += time.perf_counter() - a
                x.requires_grad_(True)
            a = time.perf_counter()
            y = stage(x)
            if last:
                y = stage.loss(y, data[i][:, 1:])
            t.fwd_s += time.perf_counter() - a
            inputs[i], outputs[i] = x, y
            if not last:
                pending.append(dist.isend(y.detach(), rank + 1))
        else:
            y = outputs.pop(i)
            grad = None
            if not last:
                grad = torch.empty(shape)
                a = time.perf_counter()
                dist.irecv(grad, rank + 1).wait()
                t.recv_s += time.perf_counter() - a
            a = time.perf_counter()
            y.backward(grad)
            t.bwd_s += time.perf_counter() - a
            x = inputs.pop(i)
            if not first:
                pending.append(dist.isend(x.grad, rank - 1))
    a = time.perf_counter()
    for w in pending:
        w.wait()
    t.send_s = time.perf_counter() - a
    a = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t.optimizer_s = time.perf_counter() - a
    t.wall_s = time.perf_counter() - t0
    t.compute_s = t.fwd_s + t.bwd_s
    return t


def calibrate(cfg: PipelineBenchConfig, iters: int) -> dict[str, float]:
    """This rank's compute, measured now under its CPU share: one block's forward and backward, the embedding's,
    the head and loss's (seconds per micro-batch), and SGD seconds per parameter."""
    c, mb = cfg.model, cfg.micro_batch
    torch.manual_seed(cfg.seed + 1)
    blk, embed = Block(c.hidden, c.heads), nn.Embedding(c.vocab, c.hidden)
    norm, head = nn.LayerNorm(c.hidden, bias=False), nn.Linear(c.hidden, c.vocab, bias=False)
    tokens = torch.randint(0, c.vocab, (mb, c.seq_len))
    x = torch.randn(mb, c.seq_len, c.hidden, requires_grad=True)
    g = torch.randn(mb, c.seq_len, c.hidden)

    def head_loss(y):
        logits = head(norm(y))
        return F.cross_entropy(logits.reshape(-1, c.vocab), tokens.reshape(-1))

    out = {}
    out["block_fwd_s"] = median_seconds(lambda: blk(x), iters)
    out["block_bwd_s"] = _backward_time(lambda: blk(x), g, iters)
    out["embed_fwd_s"] = median_seconds(lambda: embed(tokens), iters)
    out["embed_bwd_s"] = _backward_time(lambda: embed(tokens), g, iters)
    out["head_fwd_s"] = median_seconds(lambda: head_loss(x), iters)
    out["head_bwd_s"] = _backward_time(lambda: head_loss(x), None, iters)
    params = list(blk.parameters())
    for q in params:
        q.grad = torch.zeros_like(q)
    sgd = torch.optim.SGD(params, lr=cfg.lr)
    out["sgd_s_per_param"] = median_seconds(sgd.step, iters) / sum(q.numel() for q in params)
    return out


def _backward_time(forward, grad, iters: int) -> float:
    """Median time of the backward pass alone: each forward runs untimed first."""
    ts = []
    for k in range(iters + 1):
        y = forward()
        a = time.perf_counter()
        y.backward(grad)
        if k:  # the first is a warm-up
            ts.append(time.perf_counter() - a)
    return sorted(ts)[len(ts) // 2]


def stage_params(cfg: PipelineBenchConfig, s: int) -> int:
    """Parameters of stage s: its blocks (12h² each: QKV, out, MLP up and down; LayerNorm weights 2h), plus the
    embedding (V·h) on the first and the final norm and head (h + V·h) on the last."""
    c, p = cfg.model, len(cfg.stage_layers)
    h = c.hidden
    n = cfg.stage_layers[s] * (12 * h * h + 2 * h)
    return n + (c.vocab * h if s == 0 else 0) + (h + c.vocab * h if s == p - 1 else 0)


def stage_pass_times(cfg: PipelineBenchConfig, calib: list[dict[str, float]]) -> list[tuple[float, float]]:
    """(forward, backward) seconds per micro-batch of each stage from the per-block calibration: its layers × the
    block, plus the embedding on the first stage and the head and loss on the last."""
    p = len(cfg.stage_layers)
    out = []
    for s, (n, k) in enumerate(zip(cfg.stage_layers, calib)):
        ends_f = (k["embed_fwd_s"] if s == 0 else 0.0) + (k["head_fwd_s"] if s == p - 1 else 0.0)
        ends_b = (k["embed_bwd_s"] if s == 0 else 0.0) + (k["head_bwd_s"] if s == p - 1 else 0.0)
        out.append((n * k["block_fwd_s"] + ends_f, n * k["block_bwd_s"] + ends_b))
    return out


def predict(
    cfg: PipelineBenchConfig, passes: list[tuple[float, float]], cluster: dict, optimizer_s: float = 0.0
) -> dict:
    """The analytical schedule on stages with these (forward, backward) seconds per micro-batch and the cluster
    file's links: m·T_max + bubble (``pipeline_bubble``) + exposed sends (``sends_exposed``) + the optimizer."""
    from commtax.costs.pricing import PhaseCost
    from commtax.schedule.analytical import StageTime, pipeline_bubble, sends_exposed

    p, m = len(cfg.stage_layers), cfg.micro_batches
    stages = [StageTime(f + b, 0.0, 0.0, 0.0, f, b, PhaseCost()) for f, b in passes]
    t_send = send_time(cfg, cluster)
    totals = [st.total for st in stages]
    parts = {
        "compute": m * max(totals),
        "pp_bubble": pipeline_bubble(cfg.schedule, m, 1, stages),
        "pp_exposed": sends_exposed(cfg.schedule, p, 1, m, t_send, totals) if p > 1 else 0.0,
        "optimizer": optimizer_s,
    }
    return {"step_time_s": sum(parts.values()), "breakdown_s": parts, "stage_s": totals, "send_s": t_send}


def send_time(cfg: PipelineBenchConfig, cluster: dict) -> float:
    """One activation (or its gradient) between neighbouring nodes: α + bytes / B, B the slower node's link
    (each node's veth is shaped both ways, so a transfer crosses both), α its measured latency."""
    c = cfg.model
    nbytes = cfg.micro_batch * c.seq_len * c.hidden * 4  # fp32
    nets = [pool["inter_node"] for pool in cluster.get("pools") or []] or [cluster["inter_node"]]
    bw = min(n["bw_Gbps"] * 1e9 / 8 * n.get("efficiency", 1.0) for n in nets)
    latency = max(n.get("latency_us", 0.0) for n in nets) * 1e-6
    return latency + nbytes / bw


def host_load() -> list[float]:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def run(cfg: PipelineBenchConfig, sink, cluster: dict | None = None, log=print) -> dict:
    """Under torchrun, one rank per stage: warm-up and timed steps; rank 0 appends the record to ``sink``."""
    from commtax.measure.bench import init_distributed

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    init_distributed("gloo", cfg.timeout_s)
    rank, p = dist.get_rank(), dist.get_world_size()
    assert p == len(cfg.stage_layers), (p, cfg.stage_layers)
    load_before = host_load()
    per_stage: list = [None] * p
    dist.all_gather_object(per_stage, _measure_stage(cfg, rank, p))
    record = _record(cfg, per_stage, load_before)
    for st in record["stages"]:  # what the stage waited for beyond the transfers themselves: the bubble
        st["bubble_s"] = _bubble(cfg, st, p, cluster) if cluster else None
    if cluster is not None:
        record.update(_prediction(cfg, per_stage, record["step_times_s"], cluster))
    if rank == 0:
        sink.append(record)
        log(_summary_line(cfg, record, cluster))
    dist.barrier()
    dist.destroy_process_group()
    return record


def _measure_stage(cfg: PipelineBenchConfig, rank: int, p: int) -> dict:
    """This rank's stage trained for the warm-up and timed steps, its compute calibrated before and after."""
    first = sum(cfg.stage_layers[:rank])
    stage = Stage(cfg.model, first, cfg.stage_layers[rank], rank == 0, rank == p - 1, cfg.seed)
    opt = torch.optim.SGD(stage.parameters(), lr=cfg.lr)
    table = transition_table(cfg.model.vocab, cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed)
    data = [batch(table, cfg.micro_batch, cfg.model.seq_len, g) for _ in range(cfg.micro_batches)]
    before = calibrate(cfg, cfg.calibration_iters)
    times, throttled = _timed_steps(cfg, stage, opt, rank, p, data)
    after = calibrate(cfg, cfg.calibration_iters)
    return {
        "calibration": {key: (before[key] + after[key]) / 2 for key in before},
        "before": before,
        "after": after,
        "times": [asdict(t) for t in times],
        "throttled_s": throttled,
    }


def _timed_steps(
    cfg: PipelineBenchConfig, stage: Stage, opt, rank: int, p: int, data: list[torch.Tensor]
) -> tuple[list[StageTimes], float | None]:
    """The warm-up steps, then the timed ones' times and the rank's run-queue wait per timed step."""
    from commtax.measure.cgroups import runqueue_wait_s

    times = []
    throttled = None
    for k in range(cfg.warmup + cfg.steps):
        if k == cfg.warmup:
            throttled = runqueue_wait_s()
        t = run_step(stage, opt, cfg, rank, p, data)
        if k >= cfg.warmup:
            times.append(t)
    end = runqueue_wait_s()
    # time the rank's main thread waited runnable but not running (its CPU share, the host's load), per timed step
    return times, (end - throttled) / cfg.steps if throttled is not None and end is not None else None


def _record(cfg: PipelineBenchConfig, per_stage: list[dict], load_before: list[float]) -> dict:
    """The run as measured: the step time (the slowest stage's wall, median over the timed steps) and each
    stage's medians, calibration and speed."""
    p = len(per_stage)
    walls = [max(per_stage[s]["times"][k]["wall_s"] for s in range(p)) for k in range(cfg.steps)]
    return {
        "bench": "pipeline",
        "schedule": cfg.schedule,
        "stage_layers": list(cfg.stage_layers),
        "layers": sum(cfg.stage_layers),
        "micro_batches": cfg.micro_batches,
        "micro_batch": cfg.micro_batch,
        "seq_len": cfg.model.seq_len,
        "hidden": cfg.model.hidden,
        "model": cfg.model.model_spec(),
        "world_size": p,
        "steps": cfg.steps,
        "step_time_s": _median(walls),
        "step_times_s": walls,
        "stages": [_stage_row(cfg, per_stage, s) for s in range(p)],
        "calibration_drift": [
            per_stage[s]["after"]["block_fwd_s"] / per_stage[s]["before"]["block_fwd_s"] for s in range(p)
        ],
        "host_load": {"before": load_before, "after": host_load(), "cpus": os.cpu_count()},
    }


def _stage_row(cfg: PipelineBenchConfig, per_stage: list[dict], s: int) -> dict:
    """Stage s: its medians over the timed steps, its calibration, run-queue wait and speed against stage 0."""
    return {
        "stage": s,
        "layers": cfg.stage_layers[s],
        **{key: _median([t[key] for t in per_stage[s]["times"]]) for key in asdict(StageTimes())},
        "calibration": per_stage[s]["calibration"],
        "runqueue_wait_s_per_step": per_stage[s]["throttled_s"],
        "speed_vs_stage0": per_stage[0]["calibration"]["block_fwd_s"] / per_stage[s]["calibration"]["block_fwd_s"],
    }


def _bubble(cfg: PipelineBenchConfig, st: dict, p: int, cluster: dict) -> float:
    """The stage's time blocked in ``recv`` less its transfers: a middle stage receives twice per micro-batch."""
    n_recv = cfg.micro_batches * ((st["stage"] > 0) + (st["stage"] < p - 1))
    return max(0.0, st["recv_s"] - n_recv * send_time(cfg, cluster))


def _prediction(cfg: PipelineBenchConfig, per_stage: list[dict], walls: list[float], cluster: dict) -> dict:
    """The analytical schedule's step against the measured one, per timed step and from the block calibration."""
    p, m = len(per_stage), cfg.micro_batches
    # per timed step, the schedule on that step's own measured passes (each node's speed under its CPU share
    # and the host's load at that moment): what the step would take if only the schedule and the links added
    # to the compute
    per_step = []
    for k in range(cfg.steps):
        ts = [per_stage[s]["times"][k] for s in range(p)]
        passes = [(t["fwd_s"] / m, t["bwd_s"] / m) for t in ts]
        per_step.append(predict(cfg, passes, cluster, max(t["optimizer_s"] for t in ts)))
    mid = per_step[sorted(range(cfg.steps), key=lambda k: per_step[k]["step_time_s"])[cfg.steps // 2]]
    # from the per-block calibration alone (before and after the steps): any split, from the node speeds
    calib = [per_stage[s]["calibration"] for s in range(p)]
    opt = max(stage_params(cfg, s) * k["sgd_s_per_param"] for s, k in enumerate(calib))
    emulated = cluster.get("emulated") or {}
    return {
        "predicted_step_time_s": mid["step_time_s"],
        "predicted_step_times_s": [x["step_time_s"] for x in per_step],
        "predicted_breakdown_s": mid["breakdown_s"],
        "predicted_stage_s": mid["stage_s"],
        "predicted_send_s": mid["send_s"],
        "error": mid["step_time_s"] / _median(walls) - 1,
        "step_errors": [x["step_time_s"] / w - 1 for x, w in zip(per_step, walls)],
        "predicted_from_blocks_s": predict(cfg, stage_pass_times(cfg, calib), cluster, opt)["step_time_s"],
        "node_speed": emulated.get("node_speed"),
        "node_link_Gbps": emulated.get("node_link_Gbps"),
    }


def _summary_line(cfg: PipelineBenchConfig, record: dict, cluster: dict | None) -> str:
    """Rank 0's line on stderr: the step, the prediction and its error, each stage's compute, the host's load."""
    pred = (
        f", predicted {record['predicted_step_time_s'] * 1e3:.1f} ms ({record['error']:+.1%})"
        if cluster is not None
        else ""
    )
    return (
        f"pipeline {cfg.schedule} {','.join(map(str, cfg.stage_layers))}: step {record['step_time_s'] * 1e3:.1f} ms"
        f"{pred}; stage compute "
        + ", ".join(f"{st['compute_s'] * 1e3:.1f}" for st in record["stages"])
        + f" ms; load {record['host_load']['before']}"
    )
