"""docs/fabric.md's worked example: Llama-3 70B on 1,024 H100 on four fabrics, estimated and simulated, with the
run's days and rented dollars (`commtax cost --rent`) and what the fabric's switches, optics and fibre cost to buy
(decide.fabric_cost, catalog/fabric_prices.yaml). tests/test_fabric.py runs it.

Usage: python examples/fabric/worked_example.py  -> a markdown table on stdout."""

from __future__ import annotations

from pathlib import Path

from commtax.decide.cost import job_training_cost, load_prices
from commtax.decide.fabric_cost import fabric_capex
from commtax.schedule.analytical import estimate
from commtax.schedule.sim.simulate import simulate
from commtax.spec import load_job

HERE = Path(__file__).parent
CASES = (
    ("1:1 spine, contiguous", "llama3-70b-1024-h100.yaml"),
    ("4:1 spine, contiguous", "llama3-70b-1024-h100-4to1.yaml"),
    ("4:1 spine, scattered", "llama3-70b-1024-h100-4to1-scattered.yaml"),
    ("4:1 spine, scattered, co-located job (50% of the uplinks)", "llama3-70b-1024-h100-4to1-colocated.yaml"),
)


def rows() -> list[dict]:
    prices = load_prices()
    out = []
    for label, name in CASES:
        job = load_job(HERE / name)
        b = estimate(job)
        cost = job_training_cost(job, b.tokens_per_s, prices)
        out.append(
            {
                "fabric": label,
                "file": name,
                "step_s": b.step_time_s,
                "simulated_step_s": simulate(job, compare=False).breakdown.step_time_s,
                "comm_tax": b.comm_tax,
                "dp_exposed_s": b.breakdown_s["dp_exposed"],
                "days": cost.days,
                "rented_usd": cost.rented_usd,
                "fabric_capex_usd": fabric_capex(job.cluster).usd,
            }
        )
    return out


def table(rs: list[dict]) -> str:
    base = rs[0]
    lines = [
        "| fabric | step (s) | simulated (s) | comm tax | exposed DP (s) | days | rented $M | fabric $M | vs 1:1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        lines.append(
            f"| {r['fabric']} | {r['step_s']:.3f} | {r['simulated_step_s']:.3f} | {r['comm_tax']:.1%} | "
            f"{r['dp_exposed_s']:.3f} | {r['days']:.1f} | {r['rented_usd'] / 1e6:.2f} | "
            f"{r['fabric_capex_usd'] / 1e6:.2f} | {r['days'] - base['days']:+.1f} d, "
            f"{(r['rented_usd'] - base['rented_usd']) / 1e6:+.2f} $M GPU time, "
            f"{(r['fabric_capex_usd'] - base['fabric_capex_usd']) / 1e6:+.2f} $M fabric |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(rows()))
