"""One training step as a task graph: the pipeline of one data-parallel replica, every stage.

Each pipeline stage is one device (it stands for its TP × CP group, whose ranks run in lock
step) with streams ``compute``, ``tp``, ``cp``, ``pp_fwd`` (sends to the next stage),
``pp_bwd`` (gradient sends to the previous one), ``dp`` (gradient buckets, parameter
gathers) and ``dp_rs`` (ZeRO-3 reduce-scatters). Durations come from the same workload ops
and cost functions as ``estimate`` (``Costs.phase``, ``Costs.collective``, ``Costs.compute``);
the simulator decides only *when* things run. Other data-parallel replicas run the same
timeline (symmetry), so a 16K-GPU job costs what its pipeline costs.

A pass (one micro-batch through one model chunk, forward or backward) is drawn as:
  overlapped TP:   tp/t → [gemm ‖ rest of tp] → (CP alike) → rest of compute
  exposed TP:      compute → tp            (the compute stream waits for it: one task with a
                                            tail on the TP stream, see ``Sim.task``)
and backward passes start with their recompute. The last micro-batch's backward of each
chunk is cut where a gradient bucket fills, and the bucket's reduction is launched there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from commtax.costs.pricing import Costs, PhaseCost
from commtax.costs.topology import group_placement
from commtax.schedule.analytical import (
    EPPairing,
    dp_exposed,
    dp_timeline,
    dualpipe_dp_workload,
    ep_exposed,
    ep_link,
    first_chunk,
    hides_ep,
    moe_pieces,
    overlap_contention,
    pipeline_ranks,
    ranks_apart,
    slowest_dp_workload,
    slowest_stage,
    stage_times,
    unpaired_share,
)
from commtax.schedule.sim.events import Sim, SimError, Tail, TrainShape
from commtax.schedule.sim.pipeline import (
    Pass,
    ScheduleDeadlock,
    by_stage,
    dependency_order,
    pipeline_ends,
    schedule,
    virtual_stage,
)
from commtax.spec import Job
from commtax.workload.step import (
    Block,
    Collective,
    Compute,
    Workload,
    build_workload,
    grad_bucket_bytes,
    grad_bytes_per_param,
    stage_param_split,
    with_dp_stage,
)

STREAMS = ("compute", "tp", "cp", "pp_fwd", "pp_bwd", "dp", "dp_rs")
MOE_STREAMS = ("ep",)  # MoE jobs: the dispatch/combine all-to-alls (and expert-TP) the passes wait for
COMPUTE_KINDS = ("compute", "recompute", "optimizer")
# (time fraction, tasks to wait for, ZeRO-3 params to gather, buckets to reduce after: (dense, experts or None))
Piece = tuple[float, tuple[int, ...], float, list[tuple[float, float | None]]]
ONE_PIECE: list[Piece] = [(1.0, (), 0.0, [])]
# a pass as steps of (name, stream, duration, kind, tail) tasks, and the TP / CP bytes it sends
Step = tuple[str, str, float, str, Tail]
# steps, TP, CP and EP bytes, and the EP wire time (hidden or not) of the pass
Template = tuple[tuple[tuple[Step, ...], ...], float, float, float, float]


@dataclass(frozen=True)
class SimOptions:
    # gradient bucket size (bytes of gradients); None: the framework's (``grad_bucket_bytes``, what estimate prices and
    # `commtax simulate` uses; Megatron-Core's max(40e6, 1e6·dp) parameters, PyTorch DDP's 25 MiB)
    bucket_bytes: float | None = None
    nic_contention: bool = True  # DP and PP traffic of a GPU share its NIC when both leave the node
    # how they share it: "flows" at fair rates (max-min; TCP-fair under fabric.sharing: tcp; schedule/sim/network.py),
    # "channel" one transfer at a time
    network: Literal["flows", "channel"] = "flows"
    # ZeRO-2's reductions after every backward as one train per pass (events.Sim.train: the same timeline, one task
    # instead of one per bucket and per piece of the pass); False: a task per bucket, each piece of the pass its own
    bucket_trains: bool = True


@dataclass
class Device:
    """One pipeline stage: its streams, and what the builder tracks while adding its passes."""

    stage: int
    streams: dict[str, int]
    nic: int | None  # the NIC shared by PP sends and DP collectives (when both leave the node)
    dp_link: int | None  # what DP collectives hold: the NIC, or the DP link of ZeRO-3's two streams
    flows: bool = False  # ``nic`` is a flow-network link (shared fairly), not a channel (held in turn)
    prev: tuple[int, ...] = ()  # end of the last phase: the compute stream's next task waits for it
    grads: list[int] = field(default_factory=list)  # gradient reductions the optimizer waits for
    gathers: dict[int, list[int]] = field(default_factory=dict)  # ZeRO-1/2 parameter gather per chunk
    piece_ends: list[tuple[int, ...]] = field(default_factory=list)  # ZeRO-3 prefetch looks 2 back
    params: float = 0.0
    bytes: dict[str, float] = field(default_factory=lambda: {"tp": 0.0, "cp": 0.0, "pp": 0.0, "dp": 0.0})
    buckets: int = 0
    optimizer: int = -1
    edp_s: float = 0.0  # link time of the expert gradients riding in its DP tasks (reported apart as ``edp``)
    # MoE: the all-to-all wire time of the passes it ran, hidden or not (DualPipe: each of its two chunks for the half
    # of the micro-batches fed at its end, not all m of them)
    ep_s: float = 0.0


@dataclass(frozen=True)
class Chunk:
    """One model chunk (virtual stage): its blocks in forward order and the cost of each pass."""

    units: tuple[tuple[str, Block, float], ...]  # (name, block, params on this GPU), forward order
    fwd: PhaseCost
    bwd: PhaseCost
    recompute: PhaseCost
    # MoE: each unit's routed-expert parameters on this GPU (reduced over edp), aligned with ``units``; () dense
    experts: tuple[float, ...] = ()

    @property
    def params(self) -> float:
        return sum(u[2] for u in self.units)


def _sum(costs: list[PhaseCost]) -> PhaseCost:
    out = PhaseCost()
    for c in costs:
        out = out + c
    return out


MAX_BUCKETS = 100_000  # DDP's default 25 MiB gives up to ~30k (405B, pp=1); more is a typo, and memory grows with it


def network_sharing(job: Job) -> tuple[str, float]:
    """How the flow network shares a NIC: the job's ``fabric.sharing`` (max-min without a fabric) and a connection's
    round trip, 2 × the inter-node latency (costs/fabric.py: tcp_share). The standing queue (``fabric.queue_ms``)
    is already in the transfers' times (costs/topology.py adds it to the inter level's latency), so the NIC links
    carry none."""
    f = job.cluster.fabric
    if f is None or f.sharing != "tcp":
        return "max-min", 0.0
    return "tcp", 2 * job.cluster.inter_node.latency_s


def rtt_weights(rtt_s: float, queue_s: dict[str, float]) -> dict[str, float]:
    """Each kind's TCP weight on a NIC both cross: 1 / RTT², RTT = ``rtt_s`` + the standing queue its path waits behind
    (costs/fabric.py: tcp_share), relative to the least-queued kind's (1 when they are equal: the equal shares)."""
    least = min(queue_s.values())
    if rtt_s <= 0:
        return dict.fromkeys(queue_s, 1.0)
    return {k: ((rtt_s + least) / (rtt_s + q)) ** 2 for k, q in queue_s.items()}


class StepBuilder:
    """Turns a job into a ``Sim`` task graph of one step; ``build()`` then ``Sim.run()``."""

    def __init__(
        self, job: Job, workload: Workload | None = None, options: SimOptions = SimOptions(), costs: Costs | None = None
    ):
        if options.bucket_bytes is None:
            options = replace(options, bucket_bytes=grad_bucket_bytes(job))
        if not options.bucket_bytes > 0:
            raise SimError(f"bucket size must be > 0 bytes, got {options.bucket_bytes}")
        self.job, self.options = job, options
        self.wl = workload if workload is not None else build_workload(job)
        self.costs = costs if costs is not None else Costs(job)
        if ranks_apart(job, self.wl):  # MoE: the DP/EDP ops of the rank with the slowest DP, as estimate
            # the rank that paces the estimate (DualPipe: a rank holds two model stages, ``pipeline_ranks``)
            slow = slowest_stage(pipeline_ranks(job.plan.schedule, stage_times(job, self.wl, self.costs)))
            self.wl = slowest_dp_workload(job, self.wl, self.costs, slow)
        plan = job.plan
        self.p, self.v, self.m = plan.pp, plan.vp, self.wl.micro_batches
        # DualPipe: two pipelines of p virtual stages (``pipeline.dualpipe``); rank r holds model stage r (chunk 0)
        # and model stage p − 1 − r (chunk 1, virtual stage 2p − 1 − r): two stages' parameters
        # (an odd m, which the spec refuses as the reference does, would fall back to 1F1B order). DualPipeV's order
        # is ``pipeline.dualpipev``, but its V needs a layer split of its own (rank 0 holds the embedding and the
        # head; halving the 1F1B stages puts both ends on it): it still runs in 1F1B order, and simulate says so
        # ZeRO-3's per-layer gathers around split backwards are not simulated: 1F1B order too
        runs = plan.schedule == "dualpipe" and self.p > 1 and self.m % 2 == 0 and self.m >= 2 * self.p
        runs = runs and not self.wl.dp_microbatch
        self.dual = plan.schedule if runs else ""
        self.V = self.p * self.v
        # layers of each virtual stage k = chunk·p + stage, as the spec split them (uneven stages shown as they are)
        self.chunk_layers = self.wl.chunk_layers
        self._phase_cache: dict[tuple[Block, str], PhaseCost] = {}
        self._templates: dict[tuple[int, str, float], Template] = {}
        # a pass's pieces by (virtual stage, phase)
        self._cuts: dict[tuple[int, str], list[Piece]] = {}
        self._codec: dict[float, float] = {}
        self._trains: dict[tuple[int, str], TrainShape | None] = {}  # a reducing backward's train by (chunk, phase)
        self.chunks = [self._chunk(k) for k in range(self.V)]
        if self.dual == "dualpipe":  # the reverse pipeline's virtual stage p + j runs model stage j
            self.v, self.V = 2, 2 * self.p
            self.chunks += self.chunks
        self.t_send = self.costs.collective(self.wl.pp_send) if self.p > 1 else 0.0
        self.send_bytes = self.costs.sent_bytes(self.wl.pp_send) if self.p > 1 else 0.0
        self.sim = Sim(*network_sharing(job))
        self.nic_weight = {"dp": 1.0, "pp": 1.0}  # TCP weights of DP and PP transfers on a shared NIC (rtt_weights)
        self.devices: list[Device] = []
        self._sent_fwd: dict[tuple[int, int], int] = {}
        self._sent_bwd: dict[tuple[int, int], int] = {}
        self._dp_cost: dict[tuple[str, float], tuple[float, float, float]] = {}
        self._train_edp: dict[tuple[int, str], float] = {}  # a bucket train's expert (edp) link time
        self._dp_contention: float | None = None
        self.last_bwd: dict[tuple[int, int], int] = {}  # (stage, chunk) -> micro-batch of its last backward
        # zero-bubble: the backward is B (input gradient) then W (weight gradient), half each (Qi et al. 2023 take
        # T_B = T_W; as schedule.analytical.weight_grad_s); the gradients the DP reduction waits for come from W
        self.split_bwd = plan.schedule == "zb-h1" or self.dual
        self.grad_phase = "W" if self.split_bwd else "B"
        self.firsts, self.lasts = pipeline_ends(self.p, self.v, self.dual)
        if self.split_bwd and self.wl.dp_microbatch:
            raise SimError(
                f"schedule {plan.schedule} with ZeRO-3: the per-layer gathers around split backwards are not simulated"
            )
        self.stage_params = [sum(self.chunks[self.k(s, c)].params for c in range(self.v)) for s in range(self.p)]
        # the workload sizes its DP ops (and the optimizer) for the stage with the most parameters;
        # a bucket or a lighter stage takes its share of them
        self.max_stage_params = max(self.stage_params)
        # what the workload's DP ops are sized for: the fullest stage's parameters; under DualPipe a rank's buckets
        # carry both of its stages' (``analytical.dualpipe_dp_workload``)
        self.dp_norm = max(c.params for c in self.chunks[: self.p]) if self.dual else self.max_stage_params
        # MoE: each rank's (dense, expert) parameters; the DP ops are sized for the dense ones of ``wl.dp_split``
        # and each rank's expert share is its own experts (a rank without experts reduces none over edp)
        self.splits = stage_param_split(job) if self.wl.dp_stage_splits else []
        self.edp_ops, self.edp_experts = self.wl.edp_step, self.wl.dp_split[1]
        if self.splits:
            self.max_stage_params = self.dp_norm = self.wl.dp_split[0]
            # the edp ops sized for the rank with the most experts (the slowest DP rank may hold none)
            most = max(self.splits, key=lambda s: s[1])
            self.edp_ops, self.edp_experts = with_dp_stage(job, self.wl, most).edp_step, most[1]
        self.grad_bytes = grad_bytes_per_param(job)
        self.ov = plan.overlap

    def k(self, stage: int, chunk: int) -> int:
        """The virtual stage of a stage's chunk (``pipeline.virtual_stage``)."""
        return virtual_stage(self.p, stage, chunk, self.dual)

    # ------------------------------------------------------------------ costs
    def _phase(self, block: Block, which: str) -> PhaseCost:
        key = (block, which)  # by value (phases hash once)
        if key not in self._phase_cache:
            self._phase_cache[key] = self.costs.phase(getattr(block, which))
        return self._phase_cache[key]

    def _chunk(self, k: int) -> Chunk:
        wl, n = self.wl, self.chunk_layers[k]
        units: list[tuple[str, Block, float]] = []
        if k == 0:
            units.append(("embed", wl.embed, 0.0))
        if wl.moe_layer is None:
            units += [("layer", wl.layer, 0.0)] * n
        else:  # the chunk's layers in model order, each dense or MoE (``Model.is_moe_layer``)
            start = sum(self.chunk_layers[:k])
            m = self.job.model
            units += [
                ("moe", wl.moe_layer, 0.0) if m.is_moe_layer(i) else ("layer", wl.layer, 0.0)
                for i in range(start, start + n)
            ]
        if k == self.V - 1:
            units.append(("head", wl.head, 0.0))
        params = wl.params_per_gpu
        per = {
            "layer": params["layers"] / max(1, wl.layers_per_stage),
            "embed": params["embed"],
            "head": params["head"],
        }
        if wl.moe_layer is not None:  # the dense parameters of each layer kind: what the dp buckets carry
            from commtax.workload.moe import moe_dense_params_per_layer

            m, tp = self.job.model, self.job.plan.tp
            per["layer"] = m.layer_params() / tp
            per["moe"] = (m.attention_params() + 2 * m.hidden) / tp + moe_dense_params_per_layer(self.job)
        units = [(name, b, per[name]) for name, b, _ in units]
        counts: dict[str, tuple[Block, int]] = {}
        for name, b, _ in units:
            counts[name] = (b, counts.get(name, (b, 0))[1] + 1)

        def total(which: str) -> PhaseCost:
            return _sum([self._phase(b, which).scaled(c) for b, c in counts.values()])

        experts: tuple[float, ...] = ()
        if wl.moe_layer is not None:  # a MoE layer's experts are ready with its backward, the MTP ones with the head's
            from commtax.workload.moe import expert_params_per_gpu
            from commtax.workload.step import mtp_params_per_gpu

            own = {"moe": expert_params_per_gpu(self.job, 1), "head": mtp_params_per_gpu(self.job)[1]}
            experts = tuple(own.get(name, 0.0) for name, _, _ in units)
        return Chunk(tuple(units), total("fwd"), total("bwd"), total("recompute"), experts)

    @staticmethod
    def _bucket_experts(chunk: Chunk, forward: bool, buckets: list[float]) -> list[float | None]:
        """Routed-expert parameters that become ready with each dense bucket of ``chunk`` (cut in forward or
        backward order): each unit's experts spread over its dense parameters. Megatron-Core keeps expert and dense
        gradients in two buffers, bucketed in the same reverse-layer order; the experts of a layer are ready when its
        backward is, not with the embedding's gradient at the end of the pass. Dense chunks: ``None`` each."""
        if not chunk.experts:
            return [None] * len(buckets)
        units = list(zip((n for _, _, n in chunk.units), chunk.experts))
        units = units if forward else units[::-1]
        out = [0.0] * len(buckets)
        b, room = 0, buckets[0] if buckets else 0.0
        for n, e in units:
            if n <= 0.0:  # no dense parameter to ride with: the bucket being filled carries them
                out[min(b, len(out) - 1)] += e
                continue
            left = n
            while left > 1e-9 * n and b < len(buckets):
                take = min(left, room)
                out[b] += e * take / n
                left, room = left - take, room - take
                if room <= 1e-9 * buckets[b]:
                    b += 1
                    room = buckets[b] if b < len(buckets) else 0.0
            if left > 1e-9 * n:  # rounding past the last bucket
                out[-1] += e * left / n
        return out

    def _expert_share(self, params: float, stage: int) -> float:
        """The share of the workload's edp ops a bucket of ``params`` dense parameters of ``stage`` carries with
        it: the bucket's share of the rank's dense parameters times the rank's experts over those ``wl.edp_step``
        is sized for."""
        if not self.splits:
            return params / self.max_stage_params
        dense, experts = self.splits[stage]
        return params / dense * experts / max(1.0, self.edp_experts)

    def _dp(
        self, op: Collective, params: float, codec: bool = True, stage: int = 0, experts: float | None = None
    ) -> tuple[float, float]:
        """(time, sent bytes) of a DP collective of the workload, cut to ``params`` parameters of ``stage``; with
        ``codec``, a gradient reduction's codec runs in line with it (a reduction after backward: nothing to
        overlap). ``experts``: the routed-expert parameters that ride with it (``_bucket_experts``); None: the
        bucket's share of the rank's dense parameters (``_expert_share``)."""
        t, nbytes, _ = self._dp_priced(op, params, codec, stage, experts)
        return t, nbytes

    def _dp_priced(
        self, op: Collective, params: float, codec: bool = True, stage: int = 0, experts: float | None = None
    ) -> tuple[float, float, float]:
        """``_dp`` and the part of its time that the expert gradients riding with it take (their edp collective)."""
        c = Collective(op.name, op.op, op.bytes * params / self.dp_norm, op.group)
        share = 0.0
        if self.edp_ops:
            share = self._expert_share(params, stage) if experts is None else experts / max(1.0, self.edp_experts)
        key = (op.op, c.bytes, codec, share)
        if key not in self._dp_cost:
            t = self.costs.collective(c)
            edp_t = 0.0
            edp = self.edp_ops
            if edp and op in self.wl.dp_step:  # expert grads over edp ride with the dense buckets (estimate's times)
                i = min(self.wl.dp_step.index(op), len(edp) - 1)
                edp_t = self.costs.collective(Collective(edp[i].name, edp[i].op, edp[i].bytes * share, "edp"))
                t += edp_t
            if codec and self.wl.dp_step and op is self.wl.dp_step[0]:
                t += self._codec_s(params)
            self._dp_cost[key] = (t, self.costs.sent_bytes(c), edp_t)
        return self._dp_cost[key]

    def _codec_s(self, params: float) -> float:
        """The gradient codec of ``params`` gradients (``Workload.dp_codec``)."""
        s = self._codec.get(params)
        if s is None:
            s = sum(self.costs.compute(x) for x in self.wl.dp_codec) * params / self.dp_norm
            self._codec[params] = s
        return s

    # ------------------------------------------------------------------ graph
    def build(self) -> Sim:
        sim, job = self.sim, self.job
        contention = self.options.nic_contention
        pp_spans = self.p > 1 and group_placement(job, "pp", "send_recv").spans_nodes
        dp_ops = self.wl.dp_step + self.wl.dp_microbatch
        dp_spans = bool(dp_ops) and group_placement(job, "dp", dp_ops[0].op).spans_nodes
        if contention and pp_spans and dp_spans and sim.sharing == "tcp":
            self.nic_weight = rtt_weights(
                sim.rtt_s,
                {
                    "dp": group_placement(job, "dp", dp_ops[0].op).queue_s,
                    "pp": group_placement(job, "pp", "send_recv").queue_s,
                },
            )
        for s in range(self.p):
            names = STREAMS + (MOE_STREAMS if self.wl.moe_layer is not None else ())
            streams = {name: sim.stream(s, name) for name in names}
            flows = self.options.network == "flows"
            nic = None
            if contention and pp_spans and dp_spans:
                nic = sim.link(f"nic{s}") if flows else sim.channel(f"nic{s}")
            # ZeRO-3 gathers and reduce-scatters run on two streams (as FSDP's) but share one DP link
            dp_link = nic if nic is not None else (sim.channel(f"dp link {s}") if self.wl.dp_microbatch else None)
            self.devices.append(
                Device(s, streams, nic, dp_link, flows=flows and nic is not None, params=self.stage_params[s])
            )
        # DualPipe runs the reference's order (``pipeline.dualpipe``)
        name = job.plan.schedule
        if name in ("dualpipe", "dualpipev") and not self.dual:
            name = "1f1b"
        order = by_stage(schedule(name, self.p, self.m, self.v), self.p)
        for s, passes in enumerate(order):
            for x in passes:
                if x.phase == self.grad_phase:
                    self.last_bwd[(s, x.chunk)] = x.mb
        for dev in self.devices:
            self._start_of_step(dev)
        try:
            for x in dependency_order(order, self.p, self.v, self.dual):
                self._add_pass(self.devices[x.stage], x)
        except ScheduleDeadlock as e:
            raise SimError(str(e)) from None
        for dev in self.devices:
            self._end_of_step(dev)
        return sim

    def _start_of_step(self, dev: Device) -> None:
        """ZeRO-1/2 with overlapped DP: this step's parameter all-gather runs under its first forwards."""
        if len(self.wl.dp_step) < 2 or not self.ov.dp:
            return
        gather = self.wl.dp_step[1]
        for c in range(self.v):
            chunk = self.chunks[self.k(dev.stage, c)]
            buckets = self._buckets(chunk.params)
            dev.gathers[c] = [
                self._dp_task(dev, "dp", "param gather", gather, n, (), (dev.stage, -1, c, "G"), experts=e)
                for n, e in zip(buckets, self._bucket_experts(chunk, True, buckets))
            ]

    def _end_of_step(self, dev: Device) -> None:
        sim, wl = self.sim, self.wl
        c = self._dp_contention_s()
        if c > 0:  # what the hidden DP traffic took from the passes it ran under (estimate.dp_contention)
            dev.prev = (
                sim.task(
                    "dp contention", dev.streams["compute"], c, tuple(dev.prev), "dp", meta=(dev.stage, -1, -1, "C")
                ),
            )
        deps = list(dev.prev)
        if wl.dp_step and not self.ov.dp:  # one reduction of all gradients after the last backward
            reduce = dev.prev
            for _ in range(self.m if wl.grads_sharded else 1):  # ZeRO-2: each micro-batch's reduction, in turn
                reduce = (
                    self._dp_task(
                        dev, "dp", "grad reduce", wl.dp_step[0], dev.params, reduce, (dev.stage, -1, -1, "R")
                    ),
                )
            deps.extend(reduce)
        adam = wl.optimizer
        op = Compute(adam.name, adam.flop, adam.bytes * dev.params / self.max_stage_params, adam.kind)
        if self.splits:  # MoE: the rank's own dense and expert optimizer states
            op = with_dp_stage(self.job, self.wl, self.splits[dev.stage]).optimizer
        dev.optimizer = sim.task(
            "optimizer",
            dev.streams["compute"],
            self.costs.compute(op),
            deps + dev.grads,
            "optimizer",
            meta=(dev.stage, -1, -1, "O"),
        )
        dev.prev = (dev.optimizer,)
        if len(wl.dp_step) > 1 and not self.ov.dp:
            self._dp_task(dev, "dp", "param gather", wl.dp_step[1], dev.params, dev.prev, (dev.stage, -1, -1, "G"))

    def _dp_contention_s(self) -> float:
        """Compute time the overlapped DP traffic costs (SMs and HBM it takes), priced as ``estimate`` prices it on
        the slowest stage and paid once, at the end of the step's passes (the timeline does not stretch each pass
        a bucket overlaps)."""
        if self._dp_contention is None:
            cm = self.costs.cm  # None: costs given directly (hand-worked schedules), no overlap contention
            self._dp_contention = 0.0
            if cm is not None and (self.wl.dp_step or self.wl.dp_microbatch):
                slow = slowest_stage(pipeline_ranks(self.job.plan.schedule, stage_times(self.job, self.wl, self.costs)))
                wl = dualpipe_dp_workload(self.job, self.wl)  # DualPipe: a rank's two stages (dense)
                self._dp_contention = (
                    dp_exposed(self.job, wl, self.costs, slow)[1] - dp_timeline(self.job, wl, self.costs, slow)[1]
                )
        return self._dp_contention

    def _buckets(self, params: float) -> list[float]:
        size = self.options.bucket_bytes / self.grad_bytes
        n = max(1, math.ceil(params / size - 1e-9))
        if n > MAX_BUCKETS:
            raise SimError(
                f"bucket size {self.options.bucket_bytes:g} B splits a stage's gradients into {n:,} buckets "
                f"(at most {MAX_BUCKETS:,}); use a bucket of at least "
                f"{params * self.grad_bytes / MAX_BUCKETS / 2**20:.3g} MiB"
            )
        return [size] * (n - 1) + [params - size * (n - 1)]

    def _dp_task(
        self,
        dev: Device,
        stream: str,
        name: str,
        op: Collective,
        params: float,
        deps,
        meta,
        priority: int = 1,
        codec: bool = True,
        experts: float | None = None,
    ) -> int:
        t, nbytes, edp_t = self._dp_priced(op, params, codec, dev.stage, experts)
        dev.bytes["dp"] += nbytes
        dev.edp_s += edp_t
        if dev.flows:  # the DP link is the NIC: a transfer sharing it with the PP sends
            return self.sim.task(
                name,
                dev.streams[stream],
                t,
                deps,
                "dp",
                priority,
                meta=meta + (nbytes,),
                links=(dev.nic,),
                weight=self.nic_weight["dp"],
            )
        return self.sim.task(name, dev.streams[stream], t, deps, "dp", priority, dev.dp_link, meta + (nbytes,))

    def _nic(self, dev: Device) -> dict:
        """How a PP send uses the NIC: a link of the flow network, a channel held in turn, or neither."""
        if dev.nic is None:
            return {}
        return {"links": (dev.nic,), "weight": self.nic_weight["pp"]} if dev.flows else {"channel": dev.nic}

    def _template(self, pc: PhaseCost, kind: str, ep_exposed: float = 0.0) -> Template:
        """The tasks of one pass (or a piece of one) as steps; each step's tasks wait for the previous step's.
        ``ep_exposed``: the MoE all-to-all time this pass waits for (``analytical.ep_exposed``), on the ep stream."""
        ov = self.ov
        tp, cp = pc.comm.get("tp", 0.0), pc.comm.get("cp", 0.0)
        steps: list[tuple[Step, ...]] = []
        rest = pc.compute
        # Overlap decomposes the work into chunks, one per rank of the group (comm-GEMM overlap:
        # Wang et al. 2022, Transformer Engine userbuffers; ring attention: one K/V step per CP rank):
        # the first chunk's transfer has nothing to hide under, the rest runs under the GEMMs / attention.
        if tp and ov.tp:
            first = first_chunk(tp, self.job.plan.tp)
            steps.append((("tp", "tp", first, "tp", ()),))
            steps.append((("gemm", "compute", pc.gemm, kind, ()), ("tp", "tp", tp - first, "tp", ())))
            rest -= pc.gemm
        if cp and ov.cp:
            first = first_chunk(cp, self.job.plan.cp)
            steps.append((("cp", "cp", first, "cp", ()),))
            steps.append((("attention", "compute", pc.attention, kind, ()), ("cp", "cp", cp - first, "cp", ())))
            rest -= pc.attention
        # the hidden TP/CP slows the compute it runs under (SMs and HBM it takes): the compute stream pays it
        # after the overlapped step, as exposed time of that group (estimate.overlap_contention)
        cm = self.costs.cm  # None: costs given directly (hand-worked schedules), no overlap contention
        if cm is not None and ((tp and ov.tp) or (cp and ov.cp)):
            tp_h = min(pc.gemm, tp - first_chunk(tp, self.job.plan.tp)) if ov.tp else 0.0
            cp_h = min(pc.attention, cp - first_chunk(cp, self.job.plan.cp)) if ov.cp else 0.0
            for g, c in zip(("tp", "cp"), overlap_contention(cm, pc, tp_h, cp_h)):
                if c > 0:
                    steps.append(((f"{g} contention", "compute", c, kind, ((g, g, c),)),))
        # not overlapped: the compute stream waits for it — one task whose tail is drawn on the TP/CP stream
        tail = tuple((g, g, t) for g, t, hidden in (("tp", tp, ov.tp), ("cp", cp, ov.cp)) if t and not hidden)
        if ep_exposed > 0:
            tail += (("ep", "ep", ep_exposed),)
        if rest > 0 or tail:
            busy = max(0.0, rest) + sum(t for _, _, t in tail)
            steps.append(((kind, "compute", busy, kind, tail),))
        ep_bytes = pc.comm_bytes.get("ep", 0.0) + pc.comm_bytes.get("etp", 0.0)
        return tuple(steps), pc.comm_bytes.get("tp", 0.0), pc.comm_bytes.get("cp", 0.0), ep_bytes, ep_link(pc)

    def _emit(self, dev: Device, tmpl: Template, deps: tuple[int, ...], meta: tuple) -> tuple[int, ...]:
        """Add a template's tasks after ``deps``; returns the tasks that end it."""
        steps, tp_bytes, cp_bytes, ep_bytes, ep_s = tmpl
        dev.bytes["tp"] += tp_bytes
        dev.bytes["cp"] += cp_bytes
        if ep_bytes:
            dev.bytes["ep"] = dev.bytes.get("ep", 0.0) + ep_bytes
        dev.ep_s += ep_s
        task, st = self.sim.task, dev.streams
        for step in steps:
            if len(step) == 1:
                name, s, dur, kind, tail = step[0]
                deps = (task(name, st[s], dur, deps, kind, 0, None, meta, tail),)
            else:
                deps = tuple(
                    [task(name, st[s], dur, deps, kind, 0, None, meta, tail) for name, s, dur, kind, tail in step]
                )
        return deps

    def _pass_template(self, k: int, which: str, frac: float) -> Template:
        # by value: every micro-batch's pass of a chunk is cut at the same fractions (ZeRO-2 buckets), so a
        # piece's tasks are priced once, not once per micro-batch
        tmpl = self._templates.get((k, which, frac))
        if tmpl is not None:
            return tmpl
        pc = getattr(self.chunks[k], which)
        ep = 0.0
        if self.wl.moe_layer is not None:  # the pass's share of the chunk's exposed all-to-all, as estimate prices it
            ch = self.chunks[k]
            e_f, e_b = ep_exposed(self.job, ch.fwd, ch.bwd, ch.recompute, self.costs.cm, self._pairing(k))
            a_r = ep_link(ch.recompute)
            ep = {"fwd": e_f, "bwd": e_b - a_r, "recompute": a_r}[which] * frac
        tmpl = self._template(
            pc if frac == 1.0 else pc.scaled(frac), "recompute" if which == "recompute" else "compute", ep
        )
        self._templates[(k, which, frac)] = tmpl
        return tmpl

    def _pairing(self, k: int) -> EPPairing | None:
        """What the EP overlap pairs on virtual stage ``k`` (``analytical.ep_exposed``): its MoE layers as one chunk
        pair, and the pipeline's unpaired share. The timeline does not pair passes itself: each pass waits for its
        share of the priced exposure (``explain`` names it)."""
        if not hides_ep(self.job):
            return None
        layers = sum(1 for name, _, _ in self.chunks[k].units if name == "moe")
        if not layers:
            return None
        pieces = moe_pieces(self.wl, self.costs).scaled(layers)
        return EPPairing(pieces, layers, 1, unpaired_share(self.job, self.m))

    @staticmethod
    def _cut(weights: list[float], params: list[float], buckets: list[float]) -> list[tuple[float, list[int]]]:
        """Cut a pass where each bucket's last parameter is reached.

        ``weights`` and ``params`` are the time and parameters of the pass's blocks in execution
        order; time runs evenly over a block's parameters. Returns (width as a fraction of the
        pass, indices of the buckets completed at the end of the piece).
        """
        total = sum(weights) or 1.0
        pieces: list[tuple[float, list[int]]] = []
        t_done, frac0, in_bucket, b = 0.0, 0.0, 0.0, 0
        for w, n in zip(weights, params):
            left = n
            while b < len(buckets) and left >= buckets[b] - in_bucket - 1e-9 * buckets[b]:
                take = buckets[b] - in_bucket
                at = (t_done + w * ((n - left + take) / n if n else 1.0)) / total
                if pieces and at - frac0 <= 1e-12:
                    pieces[-1][1].append(b)
                else:
                    pieces.append((at - frac0, [b]))
                frac0, left, in_bucket, b = at, left - take, 0.0, b + 1
            in_bucket += left
            t_done += w
        if b < len(buckets) or frac0 < 1.0 - 1e-12:
            pieces.append((1.0 - frac0, list(range(b, len(buckets)))))
        return pieces

    def _pieces(self, dev: Device, x: Pass, chunk: Chunk) -> list[Piece]:
        """Cut a pass into (time fraction, tasks to wait for, ZeRO-3 params to gather, gradient buckets to launch
        after, each (dense parameters, routed-expert parameters riding with them or None))."""
        wl = self.wl
        first_fwd = x.phase == "F" and x.chunk in dev.gathers
        # ZeRO-2 keeps only its gradient shard: every backward reduces its buckets (``Workload.grads_sharded``)
        last_bwd = (
            x.phase == self.grad_phase
            and wl.dp_step
            and self.ov.dp
            and (wl.grads_sharded or self.last_bwd.get((x.stage, x.chunk)) == x.mb)
        )
        if not (wl.dp_microbatch or first_fwd or last_bwd):
            return ONE_PIECE
        k = self.k(x.stage, x.chunk)
        if not first_fwd:  # the same cut for every micro-batch of the chunk (it reads only the chunk and phase)
            key = (k, x.phase)
            cached = self._cuts.get(key)
            if cached is None:
                cached = self._cuts[key] = self._uncached_pieces(dev, x, chunk, False)
            return cached
        return self._uncached_pieces(dev, x, chunk, True)

    def _uncached_pieces(self, dev: Device, x: Pass, chunk: Chunk, first_fwd: bool) -> list[Piece]:
        wl = self.wl
        units = chunk.units if x.phase == "F" else chunk.units[::-1]
        which = "fwd" if x.phase == "F" else "bwd"
        weights = [
            self._phase(b, which).compute + (self._phase(b, "recompute").compute if which == "bwd" else 0.0)
            for _, b, _ in units
        ]
        params = [n for _, _, n in units]
        total = sum(weights) or 1.0
        if (
            wl.dp_microbatch
        ):  # FSDP unit = one block: gather its parameters before it, reduce-scatter its gradients after
            return [(w / total, (), n, [(n, None)] if x.phase == "B" else []) for w, n in zip(weights, params)]
        if first_fwd:  # first forward of the step: wait for each bucket's gather
            gathers = dev.gathers.pop(x.chunk)
            return [
                (w, tuple(gathers[i] for i in idx), 0.0, [])
                for w, idx in self._cut(weights, params, self._buckets(chunk.params))
            ]
        # a backward that reduces (the last micro-batch's, or every one's with ZeRO-2): a bucket's reduction is
        # launched when backward has produced its last gradient
        buckets = self._buckets(chunk.params)
        experts = self._bucket_experts(chunk, x.phase == "F", buckets)
        return [(w, (), 0.0, [(buckets[i], experts[i]) for i in idx]) for w, idx in self._cut(weights, params, buckets)]

    def _train(self, dev: Device, x: Pass, chunk: Chunk) -> TrainShape | None:
        """ZeRO-2: a backward's bucket reductions as one train (``Sim.train``), or None where a task per bucket is
        needed (ZeRO-1's last backward, a codec on the compute stream, a NIC held as a channel).

        Each bucket launches when the cut path's piece that completes it ends: the pieces run back to back on the
        device (nothing else enters its compute and TP/CP streams mid-pass), so that is the pass's start plus the
        pieces' times so far (a piece's time: its steps', each the longest of its tasks); the pass itself is then
        drawn whole. Priced once per chunk and phase, as the cut is."""
        wl = self.wl
        if not (
            self.options.bucket_trains
            and wl.grads_sharded
            and wl.dp_step
            and self.ov.dp
            and x.phase == self.grad_phase
            and not wl.dp_microbatch
            and (dev.dp_link is None or dev.flows)
        ):
            return None
        k = self.k(x.stage, x.chunk)
        key = (k, x.phase)
        if key in self._trains:
            return self._trains[key]
        shape = None
        if self._pass_tasks(k, x.phase):  # the pass has a first task to launch it from
            offsets: list[float] = []
            buckets: list[tuple[float, float | None]] = []
            at = 0.0
            for frac, _, _, reduce in self._pieces(dev, x, chunk):
                at += self._pass_s(k, x.phase, frac)
                offsets += [at] * len(reduce)
                buckets += reduce
            if buckets and all(self._codec_s(n) == 0 for n, _ in buckets):
                priced = [self._dp_priced(wl.dp_step[0], n, False, dev.stage, e) for n, e in buckets]
                shape = TrainShape(tuple(offsets), tuple(t for t, _, _ in priced), tuple(b for _, b, _ in priced))
                self._train_edp[key] = sum(x for _, _, x in priced)
        self._trains[key] = shape
        return shape

    def _pass_templates(self, k: int, phase: str, frac: float) -> list[Template]:
        """The templates a backward piece of ``frac`` emits, in order (as ``_add_pass``)."""
        if phase == "W":
            return [self._pass_template(k, "bwd", frac / 2)]
        bwd = self._pass_template(k, "bwd", frac / 2 if self.split_bwd else frac)
        return [self._pass_template(k, "recompute", frac), bwd]

    def _pass_s(self, k: int, phase: str, frac: float) -> float:
        """How long a backward piece takes on the device: its steps one after another, each its longest task."""
        return sum(max(x[2] for x in step) for tmpl in self._pass_templates(k, phase, frac) for step in tmpl[0])

    def _pass_tasks(self, k: int, phase: str) -> int:
        return sum(len(tmpl[0]) for tmpl in self._pass_templates(k, phase, 1.0))

    def _add_pass(self, dev: Device, x: Pass) -> None:
        """Add one pass's tasks (what it receives was added before: ``dependency_order``)."""
        k = self.k(x.stage, x.chunk)
        sim, st, wl = self.sim, dev.streams, self.wl
        if x.phase == "F":
            recv = self._sent_fwd.pop((k - 1, x.mb)) if k not in self.firsts else -1
        elif x.phase == "B":
            recv = self._sent_bwd.pop((k + 1, x.mb)) if k not in self.lasts else -1
        else:  # W: local, after its own B (the stage's order)
            recv = -1
        chunk = self.chunks[k]
        meta = x  # (stage, mb, chunk, phase)
        deps: tuple[int, ...] = dev.prev + ((recv,) if recv >= 0 else ())
        z3 = wl.dp_microbatch
        train = self._train(dev, x, chunk)
        anchor = len(sim.tasks)  # the pass's first task: its start launches the train
        for frac, wait, gather_params, reduce_params in ONE_PIECE if train else self._pieces(dev, x, chunk):
            deps += wait
            if z3:
                prefetch = (
                    dev.piece_ends[-2] if self.ov.dp and len(dev.piece_ends) >= 2 else (() if self.ov.dp else deps)
                )
                op = z3[0] if x.phase == "F" else z3[1]
                # a gather the compute waits for goes before a reduce-scatter ready at the same time
                deps += (self._dp_task(dev, "dp", "gather", op, gather_params, prefetch, meta, priority=0),)
            if x.phase == "B":
                deps = self._emit(dev, self._pass_template(k, "recompute", frac), deps, meta)
                deps = self._emit(dev, self._pass_template(k, "bwd", frac / 2 if self.split_bwd else frac), deps, meta)
            elif x.phase == "W":
                deps = self._emit(dev, self._pass_template(k, "bwd", frac / 2), deps, meta)
            else:
                deps = self._emit(dev, self._pass_template(k, "fwd", frac), deps, meta)
            for n, e in reduce_params:
                if z3:
                    rs = self._dp_task(dev, "dp_rs", "reduce-scatter", z3[2], n, deps, meta)
                    dev.grads.append(rs)
                    if not self.ov.dp:
                        deps += (rs,)
                else:
                    codec = self._codec_s(n)
                    if (
                        codec > 0
                    ):  # the device runs the bucket's codec: backward goes on after it (estimate.dp_step_exposed)
                        deps = (self.sim.task("grad codec", st["compute"], codec, deps, "dp", meta=meta),)
                    dev.grads.append(
                        self._dp_task(dev, "dp", "grad bucket", wl.dp_step[0], n, deps, meta, codec=False, experts=e)
                    )
                    dev.buckets += 1
            if z3:
                dev.piece_ends.append(deps)
                if len(dev.piece_ends) > 2:
                    dev.piece_ends.pop(0)
        if train is not None:
            links = (dev.nic,) if dev.flows else ()
            w = self.nic_weight["dp"] if links else 1.0
            dev.grads.append(sim.train("grad bucket", st["dp"], train, anchor, "dp", 1, meta, links, w))
            dev.bytes["dp"] += sum(train.bytes)
            dev.edp_s += self._train_edp.get((k, x.phase), 0.0)
            dev.buckets += len(train.work_s)
        dev.prev = deps
        if x.phase == "F" and k not in self.lasts:
            dev.bytes["pp"] += self.send_bytes
            self._sent_fwd[(k, x.mb)] = sim.task(
                "send", st["pp_fwd"], self.t_send, deps, "pp", meta=meta + (self.send_bytes,), **self._nic(dev)
            )
        elif x.phase == "B" and k not in self.firsts:
            dev.bytes["pp"] += self.send_bytes
            self._sent_bwd[(k, x.mb)] = sim.task(
                "send", st["pp_bwd"], self.t_send, deps, "pp", meta=meta + (self.send_bytes,), **self._nic(dev)
            )
