"""Model vs measurement, and α/β fits that make them agree: ``commtax calibrate``.

Predictions come from the project's cost model (``commtax.costs.collectives``) on the placement the
cluster file describes (``commtax.costs.topology``), with the algorithm that actually ran: gloo's
built-in all_reduce/all_gather/reduce_scatter are rings, ``--impl`` names ours.

The fit: for one level, every algorithm's time is linear in α and β = 1/B
(t = c_α·α + c_β·β, Thakur et al. 2005), so α and β come from least squares on relative
error over all records of an op (and jointly over all ops for the level defaults).
The profile's ``inter`` bandwidth is per GPU, as the model reads it: a node's k ranks share
its NIC, so B_share = B_node / k (``Placement.node_inter_bw`` multiplies it back).
No torch import: calibrating is arithmetic on a JSON file.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from commtax.costs import collectives as C
from commtax.errors import SpecError, excerpt
from commtax.measure import schedules as S
from commtax.units import GB, US

# what ran, per bench impl (gloo's own collectives are rings; broadcast is a pipelined chain/ring)
IMPL_ALGORITHM = {"torch": "ring", **S.IMPL_ALGORITHM}
FIT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
MIN_FIT_BYTES = 2**16  # smaller messages are latency noise on an emulated cluster


@dataclass(frozen=True)
class LevelFit:
    bw_bytes_per_s: float
    latency_s: float
    rms_rel: float
    max_rel: float
    count: int


def _placement(n: int, per_node: int, intra: C.Level, inter: C.Level | None) -> C.Placement:
    return C.Placement(n=n, per_node=min(per_node, n), intra=intra, inter=inter if n > per_node else None)


def model_time_s(
    op: str,
    impl: str,
    message_bytes: float,
    n: int,
    per_node: int,
    intra: C.Level,
    inter: C.Level,
    backend: str = "gloo",
) -> float:
    """Simple-protocol α-β time of ``op`` with the algorithm ``impl`` ran (no NCCL LL: gloo has none)."""
    p = _placement(n, per_node, intra, inter)
    if op == "all_to_all":
        return C.all_to_all_time(message_bytes, p)[0]
    if op == "send_recv":
        return C.send_recv_time(message_bytes, p)[0]
    if impl == "torch" and backend == "gloo":  # the library's own collectives: the predictor's gloo mode
        return C.collective_cost(op, message_bytes, dataclasses.replace(p, library="gloo")).time_s
    alg = IMPL_ALGORITHM[impl]
    funcs = {
        "ring": C.ring_time,
        "tree": C.tree_time,
        "recursive_doubling": C.recursive_doubling_time,
        "hierarchical": C.hierarchical_time,
    }
    return funcs[alg](op, message_bytes, p)[0]


def levels_from_cluster(spec: dict) -> tuple[C.Level, C.Level]:
    """Intra and inter Level of a cluster YAML (as ``commtax.costs.topology`` reads it: the inter share is per GPU)."""
    ln, net = spec["intra_node"], spec["inter_node"]
    intra = C.Level("intra", ln["bw_GBps"] * GB * ln.get("efficiency", 1.0), ln.get("latency_us", 0.0) * US)
    node_bw = spec.get("nics_per_node", 1) * net["bw_Gbps"] * 1e9 / 8 * net.get("efficiency", 1.0)
    share = node_bw / spec.get("gpus_per_node", 8)
    return intra, C.Level("inter", share, net.get("latency_us", 0.0) * US)


def levels_from_profile(profile: dict, op: str | None = None) -> tuple[C.Level, C.Level]:
    def level(name: str) -> C.Level:
        nums = (profile.get("ops", {}).get(op or "", {}) or {}).get(name) or profile["levels"][name]
        return C.Level(name, nums["bw_GBps"] * GB, nums["latency_us"] * US)

    return level("intra"), level("inter")


def level_of(rec: dict) -> str:
    return "inter" if rec.get("nodes", 1) > 1 else "intra"


def predicted_s(rec: dict, intra: C.Level, inter: C.Level) -> float:
    return model_time_s(
        rec["op"],
        rec["impl"],
        rec["message_bytes"],
        rec["world_size"],
        rec.get("ranks_per_node", rec["world_size"]),
        intra,
        inter,
        rec.get("backend", "gloo"),
    )


def _linearize(rec: dict, level: str, intra: C.Level, inter: C.Level, alpha: float, beta: float):
    """t ≈ t0 + c_α·α + c_β·β around (α, β) for the fitted level, the other level held fixed.

    Exact where the fitted level is the bottleneck (the model is piecewise linear in α, β: max/min
    between levels, sums within one), so a few Gauss-Newton rounds converge.
    """

    def t(a: float, b: float) -> float:
        lv = C.Level(level, 1.0 / b, a)
        return predicted_s(rec, lv if level == "intra" else intra, lv if level == "inter" else inter)

    d_alpha, d_beta = max(alpha * 1e-3, 1e-9), beta * 1e-3
    t_here = t(alpha, beta)
    c_alpha = (t(alpha + d_alpha, beta) - t_here) / d_alpha
    c_beta = (t(alpha, beta + d_beta) - t_here) / d_beta
    return t_here - c_alpha * alpha - c_beta * beta, c_alpha, c_beta


def fit_level(records: list[dict], level: str, intra: C.Level, inter: C.Level, rounds: int = 6) -> LevelFit | None:
    """Least squares of relative error for α and β = 1/B over ``records`` on ``level``; None if too few."""
    if len(records) < 2:
        return None
    start = intra if level == "intra" else inter
    # start above the other level's α: the ring's step latency is the max of the two (zero slope below it)
    alpha, beta = 2 * max(intra.latency_s, inter.latency_s) + 1e-6, 1.0 / start.bw_bytes_per_s
    times = np.array([r["time_s"] for r in records])
    for _ in range(rounds):
        lin = np.array([_linearize(r, level, intra, inter, alpha, beta) for r in records])
        A = lin[:, 1:] / times[:, None]
        y = (times - lin[:, 0]) / times
        (alpha, beta), *_ = np.linalg.lstsq(A, y, rcond=None)
        alpha, beta = max(float(alpha), 0.0), max(float(beta), 1e-15)
    lv = C.Level(level, 1.0 / beta, alpha)
    pred = np.array(
        [predicted_s(r, lv if level == "intra" else intra, lv if level == "inter" else inter) for r in records]
    )
    rel = pred / times - 1
    return LevelFit(1.0 / beta, alpha, float(np.sqrt(np.mean(rel**2))), float(np.abs(rel).max()), len(records))


# a fit beyond this many times the cluster file's link rate is unresolved (the records are latency-bound
# there, β hit its floor), not a faster link: the cluster's number stays and the profile says so
MAX_FIT_OVER_LINK = 10.0
MAX_LEVEL_GBPS = 100_000  # spec.LevelNumbers' bound: estimate refuses a profile above it


def resolved(fit: LevelFit | None, start: C.Level, level: str, notes: list[str]) -> LevelFit | None:
    """``fit`` if its bandwidth is one a link can have; None (keep the cluster's number, noted) otherwise."""
    if fit is None:
        return None
    bound = min(MAX_FIT_OVER_LINK * start.bw_bytes_per_s, MAX_LEVEL_GBPS * GB)
    if fit.bw_bytes_per_s <= bound and math.isfinite(fit.latency_s) and fit.latency_s / US <= 1e7:
        return fit
    notes.append(
        f"{level}: the fitted bandwidth ({fit.bw_bytes_per_s / GB:.4g} GB/s) is over {bound / GB:.4g} GB/s "
        f"({MAX_FIT_OVER_LINK:g}x the cluster's {start.bw_bytes_per_s / GB:.4g} GB/s): the records do not "
        "resolve it (latency-bound); the cluster's number is kept"
    )
    return None


def check_profile(profile: dict, where: str = "calibrate") -> dict:
    """The profile as ``cluster: {profile: FILE}`` reads it: a value estimate would refuse is never written."""
    from commtax.spec import Profile, build

    build(Profile, profile, where)
    return profile


def _numbers(fit: LevelFit) -> dict:
    return {"bw_GBps": round(fit.bw_bytes_per_s / GB, 6), "latency_us": round(fit.latency_s / US, 3)}


def calibrate(records: list[dict], cluster: dict, gemm: list[dict] | None = None, source: str = "") -> dict:
    """A hardware profile (the schema ``spec.Profile`` reads) from bench records on ``cluster``."""
    intra0, inter0 = levels_from_cluster(cluster)
    usable = [
        r
        for r in records
        if r.get("op") in FIT_OPS
        and r["message_bytes"] >= MIN_FIT_BYTES
        and r["world_size"] > 1
        and r["impl"] in IMPL_ALGORITHM
    ]
    levels, ops, residuals, notes = {}, {}, {}, []
    intra_fit = fit_level([r for r in usable if level_of(r) == "intra"], "intra", intra0, inter0)
    intra_fit = resolved(intra_fit, intra0, "intra", notes)
    intra = C.Level("intra", intra_fit.bw_bytes_per_s, intra_fit.latency_s) if intra_fit else intra0
    levels["intra"] = (
        _numbers(intra_fit)
        if intra_fit
        else {"bw_GBps": float(intra0.bw_bytes_per_s / GB), "latency_us": float(intra0.latency_s / US)}
    )
    inter_recs = [r for r in usable if level_of(r) == "inter"]
    inter_fit = resolved(fit_level(inter_recs, "inter", intra, inter0), inter0, "inter", notes)
    levels["inter"] = (
        _numbers(inter_fit)
        if inter_fit
        else {"bw_GBps": float(inter0.bw_bytes_per_s / GB), "latency_us": float(inter0.latency_s / US)}
    )
    for op in sorted({r["op"] for r in inter_recs}):
        f = resolved(fit_level([r for r in inter_recs if r["op"] == op], "inter", intra, inter0), inter0, op, notes)
        if f:
            ops[op] = {"inter": _numbers(f)}
            residuals[op] = {"rms_rel": round(f.rms_rel, 4), "max_rel": round(f.max_rel, 4), "records": f.count}
    profile = {
        "source": source or f"commtax calibrate, {_dt.date.today().isoformat()}",
        "levels": levels,
        "ops": ops,
        "residuals": {
            "per_op_inter": residuals,
            "levels": {
                k: {"rms_rel": round(f.rms_rel, 4), "max_rel": round(f.max_rel, 4), "records": f.count}
                for k, f in (("intra", intra_fit), ("inter", inter_fit))
                if f
            },
        },
    }
    if notes:
        profile["notes"] = notes
    if gemm:
        profile["gemm_efficiency"] = gemm_efficiency(gemm, cluster.get("gpu", {}).get("peak_tflops", {}))
    return check_profile(profile)


def gemm_efficiency(gemm: list[dict], peak_tflops: dict) -> dict:
    """Median achieved TFLOP/s per dtype over the catalog peak of that dtype."""
    out = {}
    for dtype in sorted({g["dtype"] for g in gemm}):
        if dtype in peak_tflops:
            achieved = float(np.median([g["tflops"] for g in gemm if g["dtype"] == dtype]))
            eff = achieved / peak_tflops[dtype]
            if not 0 < eff <= 1:
                raise SpecError(
                    f"--gemm: {dtype} achieved {achieved:g} TFLOP/s against a peak of {peak_tflops[dtype]:g}: "
                    "an efficiency must be in (0, 1]; fix the cluster's gpu.peak_tflops or re-measure"
                )
            out[dtype] = max(round(eff, 4), 1e-4)
    return out


def compare(records: list[dict], cluster: dict, profile: dict | None = None) -> list[dict]:
    """Per record: measured, predicted (cluster numbers, or the profile's), relative error."""
    rows = []
    for r in records:
        if r.get("op") not in FIT_OPS or r["world_size"] < 2 or r["impl"] not in IMPL_ALGORITHM:
            continue
        intra, inter = levels_from_profile(profile, r["op"]) if profile else levels_from_cluster(cluster)
        t = predicted_s(r, intra, inter)
        rows.append(
            {
                "op": r["op"],
                "impl": r["impl"],
                "message_bytes": r["message_bytes"],
                "measured_s": r["time_s"],
                "predicted_s": t,
                "error": t / r["time_s"] - 1,
            }
        )
    return rows


# ---------------------------------------------------------------------- input checks (one line each, exit 2)
def _positive(rec: dict, key: str, where: str, integer: bool = False, required: bool = True) -> None:
    if key not in rec and not required:
        return
    v = rec.get(key)
    ok = isinstance(v, int if integer else (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    if not ok:
        kind = "a positive integer" if integer else "a positive finite number"
        raise SpecError(f"{where}: {key} must be {kind}, got {excerpt(v)}")


def check_records(records: object, path: Path | str) -> list[dict]:
    """Bench records as calibrate reads them: a list of mappings with positive finite sizes, times and counts."""
    if not isinstance(records, list):
        raise SpecError(f"{path}: expected a JSON list of bench records (from `commtax bench collective --out`)")
    for i, r in enumerate(records):
        where = f"{path}: record {i}"
        if not isinstance(r, dict):
            raise SpecError(f"{where}: expected a mapping, got {excerpt(r)}")
        if not isinstance(r.get("op"), str) or not isinstance(r.get("impl", ""), str):
            raise SpecError(f"{where}: op and impl are names, got {excerpt(r.get('op'))}")
        if r["op"] == "gemm":
            continue
        _positive(r, "message_bytes", where)
        _positive(r, "time_s", where)
        _positive(r, "world_size", where, integer=True)
        _positive(r, "ranks_per_node", where, integer=True, required=False)
        _positive(r, "nodes", where, integer=True, required=False)
    return records


def check_records_fit(records: list[dict], cluster: dict, path: Path | str) -> list[dict]:
    """Records that could have run on ``cluster``: no more ranks than its GPUs, no more per node than a node has."""
    n, per_node = cluster.get("num_gpus"), cluster.get("gpus_per_node")
    for i, r in enumerate(records):
        if r.get("op") == "gemm":
            continue
        if isinstance(n, int) and r["world_size"] > n:
            raise SpecError(
                f"{path}: record {i}: world_size {r['world_size']} is more than the cluster's {n} GPUs: "
                "these records are not from this cluster; give the --cluster they ran on"
            )
        if isinstance(per_node, int) and r.get("ranks_per_node", 1) > per_node:
            raise SpecError(
                f"{path}: record {i}: ranks_per_node {r['ranks_per_node']} is more than the cluster's "
                f"gpus_per_node ({per_node}); give the --cluster they ran on"
            )
    return records


def check_gemm(gemm: object, path: Path | str) -> list[dict]:
    """GEMM records (`commtax bench gemm --out`): each a dtype name and achieved TFLOP/s > 0."""
    if not isinstance(gemm, list):
        raise SpecError(f"{path}: expected a JSON list of GEMM records (from `commtax bench gemm --out`)")
    for i, g in enumerate(gemm):
        if not isinstance(g, dict) or not isinstance(g.get("dtype"), str):
            raise SpecError(f"{path}: record {i}: expected a mapping with dtype and tflops, got {excerpt(g)}")
        _positive(g, "tflops", f"{path}: record {i}")
    return gemm


def check_cluster(raw: dict, path: Path | str, field: str = "--cluster") -> dict:
    """The cluster file as the spec validates it (catalog ids resolved, zero bandwidths and GPUs per node refused)."""
    from commtax.spec import Cluster, build, load_catalog, resolve_cluster

    resolved = resolve_cluster(raw, load_catalog(), Path(path).parent, field=field)
    build(Cluster, resolved, field)
    return resolved


def write_profile(profile: dict, path: Path | str) -> None:
    import yaml

    from commtax.measure.results import write_atomic

    write_atomic(Path(path), yaml.safe_dump(profile, sort_keys=False))


# ---------------------------------------------------------------------- commtax calibrate, files in and out
def read_cluster(path: Path, option: str = "--cluster") -> dict:
    """The cluster YAML a bench ran on (or a job file's ``cluster:``); a missing or malformed file -> one line."""
    from commtax.measure.cluster import load_cluster_file

    if not path.exists():
        raise SpecError(f"{option}: {path} does not exist; create it with `commtax cluster up --out {path}`")
    try:
        return load_cluster_file(path)
    except ValueError as e:  # unreadable, not UTF-8, an alias bomb, not a mapping: one line
        raise SpecError(f"{option}: {e}") from None


@dataclass(frozen=True)
class Calibration:
    """A fit of a bench's records: the profile, the cluster it ran on and the records it was fitted to."""

    profile: dict
    cluster: dict
    records: list[dict]

    def residuals(self) -> list[tuple[dict, dict]]:
        """Each record's model error before (catalog numbers) and after (the profile) calibrating."""
        return list(zip(compare(self.records, self.cluster), compare(self.records, self.cluster, self.profile)))


def calibrate_files(
    bench_json: Path, cluster_file: Path, gemm_json: Path | None = None, impl: str = "torch"
) -> Calibration:
    """``commtax calibrate``: fit the records of ``impl`` in ``bench_json`` (and the GEMM records) on the cluster
    they ran on. Bad input raises a ``SpecError`` whose text is the user's one line (``calibrate: …``)."""
    import json

    from commtax.spec import read_text

    try:
        records = check_records(json.loads(read_text(bench_json, "JSON file")), bench_json)
        gemm = check_gemm(json.loads(read_text(gemm_json, "JSON file")), gemm_json) if gemm_json else None
    except ValueError as e:  # SpecError, or JSON that does not parse
        raise SpecError(f"calibrate: {e}") from None
    raw = read_cluster(cluster_file)
    try:
        cluster = check_cluster(raw, cluster_file)
        records = check_records_fit(records, cluster, bench_json)
        records = [r for r in records if r.get("impl") == impl]
        profile = calibrate(records, cluster, gemm, source=f"commtax calibrate from {bench_json.name}")
    except ValueError as e:
        raise SpecError(f"calibrate: {e}") from None
    levels = profile["residuals"]["levels"]
    if not profile["ops"] and "inter" not in levels and "intra" not in levels:
        raise SpecError(f"calibrate: {bench_json} has no multi-rank collective records ≥ 64 KiB to fit")
    return Calibration(profile, cluster, records)


def write_calibration(c: Calibration, out: Path, cluster_out: Path | None = None) -> None:
    """The profile YAML; with ``cluster_out``, the cluster YAML too, its ``profile:`` pointing at ``out``."""
    import yaml

    from commtax.measure.results import write_atomic

    write_profile(c.profile, out)
    if cluster_out is not None:
        write_atomic(cluster_out, yaml.safe_dump({**c.cluster, "profile": str(out.resolve())}, sort_keys=False))
