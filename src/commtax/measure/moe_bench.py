"""``commtax bench moe``: one MoE layer under torch.distributed, phase by phase, measured and predicted.

Expert parallelism over every rank: E experts, E/n on each rank (expert e on rank e // (E/n)). Per step, on every
rank, T tokens (hidden h, fp32) go through:

    router     logits = x·W_r + b (T×h·h×E), softmax, top-k, the k weights renormalised to sum 1 (Mixtral)
    permute    the T·k (token, expert) pairs sorted by expert, rows gathered into that order
    dispatch   the per-rank counts exchanged (all_to_all_single of E ints), then the rows with
               ``all_to_all_single`` at the splits the router produced (uneven)
    experts    received rows grouped by local expert, MLP  gelu(x·W1)·W2  (h×ffn, ffn×h), back to arrival order
    combine    the reverse all_to_all_single (the splits transposed)
    unpermute  each row scaled by its routing weight and added back to its token (index_add)

Routing imbalance λ = max/mean tokens per expert over all ranks. ``imbalance`` > 1 adds a bias to one hot
expert's logit, found by bisection on this rank's tokens so λ reaches the target (as a popular expert does); the
record has the λ measured on the routed tokens. The same tokens are routed every step (fixed seed), so the splits
and λ are the same in every step. Ranks meet at a barrier before each step; each phase is timed on every rank;
the record keeps the slowest rank's median per phase (the all-to-alls line the ranks up: the slowest sets the pace).
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

PHASES = ("router", "permute", "dispatch", "experts", "combine", "unpermute")
BYTES = 4  # fp32 activations


@dataclass(frozen=True)
class MoEBenchConfig:
    experts: int = 8
    top_k: int = 2
    hidden: int = 256
    ffn: int = 512
    tokens: int = 1024  # per rank
    imbalance: float = 1.0  # target λ; 1 = the router's own (near-uniform) choice
    steps: int = 10
    warmup: int = 2
    seed: int = 0
    timeout_s: float = 300.0


# ----------------------------------------------------------------------------- the layer
@dataclass
class Routing:
    """One rank's routed tokens: which rows go where, with what weight."""

    order: torch.Tensor  # T·k: flat (token, slot) indices sorted by expert
    token: torch.Tensor  # T·k: the token of each sorted pair
    weight: torch.Tensor  # T·k: its routing weight
    expert_counts: torch.Tensor  # E: pairs per expert from this rank


def experts_per_rank(cfg: MoEBenchConfig, n: int) -> int:
    return cfg.experts // n


def route(x: torch.Tensor, w_router: torch.Tensor, bias: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts of each token and their renormalised weights."""
    probs = torch.softmax(x @ w_router + bias, dim=-1)
    w, idx = torch.topk(probs, top_k, dim=-1)
    return idx, w / w.sum(-1, keepdim=True)


def permute(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, experts: int) -> tuple[torch.Tensor, Routing]:
    """Rows in expert order (stable: within an expert, token order)."""
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // idx.shape[1]
    counts = torch.bincount(flat, minlength=experts)
    return x.index_select(0, token), Routing(order, token, w.reshape(-1)[order], counts)


def rank_splits(expert_counts: torch.Tensor, n: int) -> list[int]:
    """Rows for each rank: the counts of its E/n experts."""
    return expert_counts.view(n, -1).sum(1).tolist()


def exchange_counts(expert_counts: torch.Tensor, n: int) -> torch.Tensor:
    """recv[s, e]: rows rank s sends for each of this rank's local experts (all_to_all_single of E ints)."""
    recv = torch.empty_like(expert_counts)
    dist.all_to_all_single(recv, expert_counts.contiguous())
    return recv.view(n, -1)


class ByteCounter:
    """Bytes this rank hands ``all_to_all_single`` for other ranks, and receives from them, per call."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.received: list[int] = []

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> None:
        rank, row = dist.get_rank(), inp.element_size() * math.prod(inp.shape[1:])  # a rank may receive no rows
        self.sent.append(row * (sum(in_splits) - in_splits[rank]))
        self.received.append(row * (sum(out_splits) - out_splits[rank]))
        dist.all_to_all_single(out, inp, out_splits, in_splits)


def expert_mlp(rows: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.gelu(rows @ w1) @ w2


def run_experts(recv: torch.Tensor, recv_counts: torch.Tensor, w1: list, w2: list, identity: bool = False):
    """recv holds, per source rank, its rows for local expert 0, 1, …: group by expert, run each MLP, put back
    (``identity``: the rows pass through unchanged, for the check that every row comes back to its token)."""
    n, local = recv_counts.shape
    pieces = list(torch.split(recv, recv_counts.reshape(-1).tolist()))  # [s * local + e]
    out = [None] * len(pieces)
    for e in range(local):
        mine = [pieces[s * local + e] for s in range(n)]
        grouped = torch.cat(mine)
        y = grouped if identity else expert_mlp(grouped, w1[e], w2[e])
        for s, part in zip(range(n), torch.split(y, [p.shape[0] for p in mine])):
            out[s * local + e] = part
    return torch.cat(out) if out else recv


def unpermute(back: torch.Tensor, r: Routing, tokens: int) -> torch.Tensor:
    out = torch.zeros(tokens, back.shape[1], dtype=back.dtype)
    return out.index_add_(0, r.token, back * r.weight.unsqueeze(1))


class MoELayer:
    """This rank's share of the layer: the router (replicated) and its E/n experts; weights from the seed."""

    def __init__(self, cfg: MoEBenchConfig, n: int, rank: int):
        self.cfg, self.n, self.rank = cfg, n, rank
        g = torch.Generator().manual_seed(cfg.seed)
        h, f, E = cfg.hidden, cfg.ffn, cfg.experts
        self.w_router = torch.randn(h, E, generator=g) / h**0.5
        all_w1 = [torch.randn(h, f, generator=g) / h**0.5 for _ in range(E)]
        all_w2 = [torch.randn(f, h, generator=g) / f**0.5 for _ in range(E)]
        lo = rank * experts_per_rank(cfg, n)
        self.w1 = all_w1[lo : lo + experts_per_rank(cfg, n)]
        self.w2 = all_w2[lo : lo + experts_per_rank(cfg, n)]
        self.all_w1, self.all_w2 = all_w1, all_w2  # for the reference check
        gx = torch.Generator().manual_seed(cfg.seed * 7919 + 1 + rank)
        self.x = torch.randn(cfg.tokens, h, generator=gx)
        self.bias = torch.zeros(E)
        if cfg.imbalance > 1.0:
            self.bias[0] = hot_bias(self.x, self.w_router, cfg.top_k, cfg.imbalance)
        self.counter = ByteCounter()
        self.identity = False

    def forward(self, times: dict[str, list[float]] | None = None) -> tuple[torch.Tensor, Routing, torch.Tensor]:
        """One layer pass; per-phase seconds appended to ``times``. Returns (output, routing, recv_counts)."""
        n, E = self.n, self.cfg.experts
        clock = [time.perf_counter()]

        def lap(name: str) -> None:
            clock.append(time.perf_counter())
            if times is not None:
                times[name].append(clock[-1] - clock[-2])

        idx, w = route(self.x, self.w_router, self.bias, self.cfg.top_k)
        lap("router")
        rows, r = permute(self.x, idx, w, E)
        lap("permute")
        recv_counts = exchange_counts(r.expert_counts, n)
        send_splits, recv_splits = rank_splits(r.expert_counts, n), recv_counts.sum(1).tolist()
        recv = torch.empty(sum(recv_splits), self.cfg.hidden)
        self.counter.all_to_all(recv, rows, recv_splits, send_splits)
        lap("dispatch")
        y = run_experts(recv, recv_counts, self.w1, self.w2, self.identity)
        lap("experts")
        back = torch.empty_like(rows)
        self.counter.all_to_all(back, y, send_splits, recv_splits)
        lap("combine")
        out = unpermute(back, r, self.cfg.tokens)
        lap("unpermute")
        return out, r, recv_counts

    def reference(self) -> torch.Tensor:
        """The layer computed on this rank alone with every expert's weights (the check of routing and return)."""
        idx, w = route(self.x, self.w_router, self.bias, self.cfg.top_k)
        out = torch.zeros_like(self.x)
        for slot in range(self.cfg.top_k):
            for e in range(self.cfg.experts):
                m = idx[:, slot] == e
                if m.any():
                    out[m] += w[m, slot, None] * expert_mlp(self.x[m], self.all_w1[e], self.all_w2[e])
        return out


def imbalance_of(counts: torch.Tensor) -> float:
    """λ = max / mean tokens per expert."""
    c = counts.to(torch.float64)
    return float(c.max() / c.mean()) if float(c.sum()) > 0 else 1.0


def hot_bias(x: torch.Tensor, w_router: torch.Tensor, top_k: int, target: float, iters: int = 40) -> float:
    """The logit bias on expert 0 that makes λ of these tokens' routing reach ``target`` (bisection: λ grows with
    the bias, from the router's own ~1 to E/k, every token picking expert 0)."""
    E = w_router.shape[1]
    lo, hi = 0.0, 1.0
    bias = torch.zeros(E)

    def lam(b: float) -> float:
        bias[0] = b
        idx, _ = route(x, w_router, bias, top_k)
        return imbalance_of(torch.bincount(idx.reshape(-1), minlength=E))

    while lam(hi) < target and hi < 1e3:
        hi *= 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if lam(mid) < target else (lo, mid)
    return hi


# ----------------------------------------------------------------------------- calibration
class ComputeTwin:
    """This rank's compute rates, sampled right after each timed step (the same time window and host load as the
    step, as ``bench ddp``'s compute-only twins): fp32 GEMM FLOP/s at the expert MLP's two shapes (m = the balanced
    rows per expert) and at the router's, the elementwise GELU rate, and a row-gather copy bandwidth.

    Operands are allocated once and reused: in the layer an expert's weights (h·ffn·4 B each, reused every step) and
    the rows it runs on (just written by the dispatch) are in cache too, so no cache flush (unlike ``ddp_bench``)."""

    def __init__(self, cfg: MoEBenchConfig, rows_per_expert: int):
        h, f, E, T = cfg.hidden, cfg.ffn, cfg.experts, cfg.tokens
        self.cfg, self.m = cfg, max(1, rows_per_expert)
        x, w1, w2, hid = torch.randn(self.m, h), torch.randn(h, f), torch.randn(f, h), torch.randn(self.m, f)
        xr, wr = torch.randn(T, h), torch.randn(h, E)
        idx = torch.randint(0, T, (T * cfg.top_k,))
        self.ops = (
            lambda: x @ w1,
            lambda: hid @ w2,
            lambda: xr @ wr,
            lambda: F.gelu(hid),
            lambda: xr.index_select(0, idx),
        )
        self.samples: list[list[float]] = []
        for op in self.ops:
            op()

    def sample(self) -> None:
        ts = []
        for op in self.ops:
            t0 = time.perf_counter()
            op()
            ts.append(time.perf_counter() - t0)
        self.samples.append(ts)

    def rates(self) -> dict:
        """Median per op over the samples, slowest rank (MAX: it sets the pace)."""
        cols = list(zip(*self.samples))
        t = torch.tensor([_median(list(c)) for c in cols], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        up, down, router, gelu, gather = t.tolist()
        cfg, m = self.cfg, self.m
        h, f, E, T = cfg.hidden, cfg.ffn, cfg.experts, cfg.tokens
        return {
            "expert_up_flop_per_s": 2 * m * h * f / up,
            "expert_down_flop_per_s": 2 * m * f * h / down,
            "router_flop_per_s": 2 * T * h * E / router,
            "gelu_elem_per_s": m * f / gelu,
            "gather_bytes_per_s": 2 * T * cfg.top_k * h * BYTES / gather,  # read + write of each gathered row
            "rows_per_expert": m,
            "samples": len(self.samples),
        }


def probe_reverse_share(nbytes_per_pair: int, iters: int = 5) -> dict:
    """κ of the node links: a symmetric all_to_all_single (``nbytes_per_pair`` between every two ranks on different
    nodes, nothing inside a node) timed barrier to barrier; κ = t · B_node / bytes − 1 where bytes is one direction
    of a node link. Returns the time and bytes; κ is derived with the cluster file's link rate in ``predict``."""
    n, rank = dist.get_world_size(), dist.get_rank()
    rpn = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    splits = [0 if j // rpn == rank // rpn else nbytes_per_pair for j in range(n)]
    a, b = torch.zeros(sum(splits), dtype=torch.uint8), torch.zeros(sum(splits), dtype=torch.uint8)
    dist.all_to_all_single(b, a, splits, splits)
    ts = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_to_all_single(b, a, splits, splits)
        dist.barrier()
        ts.append(time.perf_counter() - t0)
    return {"probe_bytes_per_pair": nbytes_per_pair, "probe_s": sorted(ts)[len(ts) // 2], "ranks_per_node": rpn}


# ----------------------------------------------------------------------------- the bench
def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def bench(cfg: MoEBenchConfig, dog=None, twin: ComputeTwin | None = None) -> dict:
    """The timed steps and the record's measured part (collective: every rank calls it); ``twin`` samples the
    compute rates after each timed step."""
    n, rank = dist.get_world_size(), dist.get_rank()
    layer = MoELayer(cfg, n, rank)
    for _ in range(cfg.warmup):
        layer.forward()
    layer.counter = ByteCounter()
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    layer_s: list[float] = []
    for i in range(cfg.steps):
        if dog is not None:
            dog.step(i, f"bench moe step {i}")
        dist.barrier()
        t0 = time.perf_counter()
        _, r, _ = layer.forward(times)
        layer_s.append(time.perf_counter() - t0)
        if twin is not None:
            twin.sample()
    if dog is not None:
        dog.disarm()
    # per rank: each phase's median, the layer's median, and the all-to-alls' share of the timed steps (a ratio of
    # sums, ≤ 1: its waits for slower ranks are inside its all-to-alls)
    share = (sum(times["dispatch"]) + sum(times["combine"])) / sum(layer_s)
    mine = torch.tensor([_median(times[p]) for p in PHASES] + [_median(layer_s), share], dtype=torch.float64)
    by_rank = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(by_rank, mine)
    med = torch.stack(by_rank).max(0).values
    world_counts = r.expert_counts.clone()
    dist.all_reduce(world_counts)
    # the traffic matrix in rows: every rank's send splits
    splits = torch.tensor(rank_splits(r.expert_counts, n), dtype=torch.int64)
    matrix = [torch.empty_like(splits) for _ in range(n)]
    dist.all_gather(matrix, splits)
    c = layer.counter  # calls of the first timed step: [0] dispatch, [1] combine
    sent = torch.tensor([c.sent[0], c.received[0], c.sent[1], c.received[1]], dtype=torch.int64)
    per_rank = [torch.empty_like(sent) for _ in range(n)]
    dist.all_gather(per_rank, sent)
    return {
        "bench": "moe",
        **asdict(cfg),
        "world_size": n,
        "ranks_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "backend": dist.get_backend(),
        "experts_per_rank": experts_per_rank(cfg, n),
        "tokens_per_expert": world_counts.tolist(),
        "measured_imbalance": imbalance_of(world_counts),
        "split_rows": [m.tolist() for m in matrix],
        "bytes_per_row": cfg.hidden * BYTES,
        "dispatch_sent_bytes": [int(p[0]) for p in per_rank],
        "dispatch_received_bytes": [int(p[1]) for p in per_rank],
        "combine_sent_bytes": [int(p[2]) for p in per_rank],
        "combine_received_bytes": [int(p[3]) for p in per_rank],
        **{f"{p}_s": float(v) for p, v in zip(PHASES, med[: len(PHASES)])},
        "layer_s": float(med[len(PHASES)]),
        "a2a_share": sum(float(r[-1]) for r in by_rank) / n,  # the layer's all-to-all tax, mean over ranks
        "phase_s_by_rank": {p: [float(r[i]) for r in by_rank] for i, p in enumerate((*PHASES, "layer"))},
        "unix_time": time.time(),
    }


# ----------------------------------------------------------------------------- prediction (torch-free below)
def traffic_bytes(record: dict) -> list[list[float]]:
    """The dispatch matrix in bytes: rows rank i sends rank j × bytes per row."""
    return [[float(c) * record["bytes_per_row"] for c in row] for row in record["split_rows"]]


def transpose(m: list[list[float]]) -> list[list[float]]:
    return [list(col) for col in zip(*m)]


def cluster_placement(cluster: dict, n: int, ranks_per_node: int):
    """The collectives ``Placement`` of all n ranks as one group on the cluster file (torch-free)."""
    from commtax.costs.topology import placement
    from commtax.spec import Cluster, build, load_catalog, resolve_cluster

    raw = resolve_cluster({**cluster, "num_gpus": n, "gpus_per_node": ranks_per_node}, load_catalog())
    return placement(build(Cluster, raw, "--cluster"), n, 1, "all_to_all")


def reverse_share(probe: dict, p) -> float:
    """κ from the probe: t · B_node / (bytes one way on a node link) − 1, in [0, 1], the (n − 1) α taken off first."""
    if p.inter is None or p.nodes < 2:
        return 0.0
    rpn = probe["ranks_per_node"]
    one_way = rpn * (p.n - rpn) * probe["probe_bytes_per_pair"] / (p.nodes - 1)  # to each other node … 2 nodes: all
    t = probe["probe_s"] - (p.n - 1) * p.inter.latency_s
    return min(1.0, max(0.0, t * p.node_inter_bw / one_way - 1.0))


def predict(record: dict, cluster: dict) -> dict:
    """Each phase from the commtax cost model: the all-to-alls from ``costs.alltoall`` on the cluster file's links
    (gloo: κ from the record's probe), the compute phases from the rates calibrated on this machine in the same run
    (``record["calibration"]``). Recomputable from a saved record.

    Per phase the busiest rank's time (the all-to-alls line the ranks up): the router and permute do the same
    work on every rank; the experts' rank is the one that received the most rows (λ stretches it); unpermute
    scales and adds back T·k rows on every rank.
    """
    from commtax.costs.alltoall import routed_all_to_all

    calib = record["calibration"]
    n, rpn = record["world_size"], record["ranks_per_node"]
    h, f, E, T, k = record["hidden"], record["ffn"], record["experts"], record["tokens"], record["top_k"]
    p = cluster_placement(cluster, n, rpn)
    # gloo: this run's probe at the dispatch's own size; without one, the cluster file's (`cluster up`'s probe)
    kappa = (reverse_share(calib, p) if "probe_s" in calib else p.reverse_share) if p.library == "gloo" else 0.0
    m = traffic_bytes(record)
    dispatch = routed_all_to_all(m, p, kappa)
    combine = routed_all_to_all(transpose(m), p, kappa)
    counts_a2a = routed_all_to_all([[8.0 * E / n] * n for _ in range(n)], p, kappa)  # E int64 counts
    per = E // n
    tpe = record["tokens_per_expert"]
    gemm_flop = [2 * tpe[e] * h * f for e in range(E)]  # per GEMM (up or down) of expert e
    experts_rank = [
        sum(
            gemm_flop[e] / calib["expert_up_flop_per_s"]
            + gemm_flop[e] / calib["expert_down_flop_per_s"]
            + tpe[e] * f / calib["gelu_elem_per_s"]
            for e in range(r * per, (r + 1) * per)
        )
        # grouping by expert and back: two copies of the received rows (read + write each)
        + 4 * sum(tpe[r * per : (r + 1) * per]) * h * BYTES / calib["gather_bytes_per_s"]
        for r in range(n)
    ]
    rows_bytes = T * k * h * BYTES
    pred = {
        "router": 2 * T * h * E / calib["router_flop_per_s"],
        "permute": 2 * rows_bytes / calib["gather_bytes_per_s"],  # gather T·k rows: read + write
        "dispatch": counts_a2a.time_s + dispatch.time_s,
        "experts": max(experts_rank),
        "combine": combine.time_s,
        # scale (read + write) and index_add (read row, read + write the token): 5 row passes
        "unpermute": 5 * rows_bytes / calib["gather_bytes_per_s"],
    }
    return {
        **{f"predicted_{ph}_s": v for ph, v in pred.items()},
        "predicted_layer_s": sum(pred.values()),
        "predicted_a2a_share": (pred["dispatch"] + pred["combine"]) / sum(pred.values()),
        "predicted_dispatch_sent_bytes": list(dispatch.send_bytes),
        "predicted_dispatch_received_bytes": list(dispatch.recv_bytes),
        "predicted_inter_node_bytes": {"out": list(dispatch.inter_out_bytes), "in": list(dispatch.inter_in_bytes)},
        "predicted_a2a_bottleneck": dispatch.bottleneck,
        "reverse_share": kappa,
        "reverse_share_from": (
            "none (nccl)" if p.library != "gloo" else "probe" if "probe_s" in calib else "cluster file (cluster up)"
        ),
    }


# ----------------------------------------------------------------------------- entry
def _where() -> str:
    return (
        f"node {os.environ.get('GROUP_RANK', '?')}, local rank {os.environ.get('LOCAL_RANK', '?')}, "
        f"{socket.gethostname()} pid {os.getpid()}"
    )


def check_routing(cfg: MoEBenchConfig) -> dict:
    """The layer's correctness on this run's ranks (collective), worst rank:

    * identity experts: every row comes back to the token it left (out = x, the k weights sum to 1);
    * the real experts: out equals the layer computed on one rank with every expert's weights;
    * the counts each rank received (the dispatch's receive splits) equal what the senders routed to it."""
    n, rank = dist.get_world_size(), dist.get_rank()
    layer = MoELayer(cfg, n, rank)
    layer.identity = True
    out, _, _ = layer.forward()
    identity_err = float((out - layer.x).abs().max())
    layer.identity = False
    out, r, recv_counts = layer.forward()
    ref_err = float((out - layer.reference()).abs().max())
    sent = torch.tensor(rank_splits(r.expert_counts, n), dtype=torch.int64)
    table = [torch.empty_like(sent) for _ in range(n)]
    dist.all_gather(table, sent)
    mismatch = float(recv_counts.sum(1).tolist() != [int(t[rank]) for t in table])
    t = torch.tensor([identity_err, ref_err, mismatch], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {
        "check_identity_max_abs_error": float(t[0]),
        "check_reference_max_abs_error": float(t[1]),
        "check_counts_match": bool(t[2] == 0),
    }


def run(cfg: MoEBenchConfig, sink, cluster: dict | None = None, log=print) -> dict:
    """Under torchrun: calibrate (with a cluster file), bench, calibrate again; rank 0 appends the record."""
    from commtax.measure.bench import init_distributed
    from commtax.measure.watchdog import Watchdog

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    init_distributed("gloo", cfg.timeout_s)
    rank, n = dist.get_rank(), dist.get_world_size()
    dog = Watchdog(dist.distributed_c10d._get_default_store(), rank, n, cfg.timeout_s, _where())
    balanced_rows = cfg.tokens * cfg.top_k * n // cfg.experts
    probe_bytes = max(64 * 1024, cfg.tokens * cfg.top_k * cfg.hidden * BYTES // n)  # a dispatch's per-pair share
    twin = ComputeTwin(cfg, balanced_rows) if cluster is not None else None
    probe = probe_reverse_share(probe_bytes) if cluster is not None else None
    rec = bench(cfg, dog, twin)
    rec.update(check_routing(cfg))
    if cluster is not None:
        probe2 = probe_reverse_share(probe_bytes)
        probe = {**probe, "probe_s": (probe["probe_s"] + probe2["probe_s"]) / 2}
        rec["calibration"] = {
            **twin.rates(),
            **probe,
            "source": "compute: sampled after each timed step; probe: before and after the steps, mean",
        }
    rec["load_average"] = os.getloadavg()[0]
    if rank == 0 and cluster is not None:
        try:
            rec.update(predict(rec, cluster))
        except Exception as e:  # the measurement is kept; `predict` can be re-run on the saved record
            rec["prediction_error"] = f"{type(e).__name__}: {e}"
    if rank == 0:
        sink.append(rec)
        for ph in (*PHASES, "layer"):
            pred = rec.get(f"predicted_{ph}_s")
            tail = f"  predicted {pred * 1e3:8.2f} ms" if pred is not None else ""
            log(f"{ph:>10}: {rec[f'{ph}_s'] * 1e3:8.2f} ms{tail}")
        log(
            f"λ measured {rec['measured_imbalance']:.2f}; dispatch bytes sent per rank "
            f"{', '.join(f'{b / 1e6:.3f}' for b in rec['dispatch_sent_bytes'])} MB"
        )
    dog.stop()
    dist.barrier()
    dist.destroy_process_group()
    return rec
