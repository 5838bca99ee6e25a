"""``commtax bench pipeline`` (measure/pipeline_bench.py) and unequal emulated nodes (``cluster up --node-speed``)."""

from __future__ import annotations

import json

import pytest
import yaml

from commtax.measure.testing import cli, records, require_netns

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch]

from commtax.measure.ddp_bench import GPTConfig  # noqa: E402
from commtax.measure.pipeline_bench import PipelineBenchConfig, predict, schedule_ops, stage_params  # noqa: E402

NET = {"inter_node": {"bw_Gbps": 8.0, "latency_us": 0.0, "efficiency": 1.0}}  # 1e9 bytes/s


def test_1f1b_and_gpipe_orders_hand_worked():
    # 1F1B, stage 0 of 2, m = 4: one warm-up forward, then F/B in turn, then the last backward (Megatron-LM)
    assert schedule_ops("1f1b", 0, 2, 4) == [
        ("F", 0),
        ("F", 1),
        ("B", 0),
        ("F", 2),
        ("B", 1),
        ("F", 3),
        ("B", 2),
        ("B", 3),
    ]
    assert schedule_ops("1f1b", 1, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert schedule_ops("gpipe", 0, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_prediction_hand_worked():
    cfg = PipelineBenchConfig((2, 2), "1f1b", micro_batches=4, micro_batch=1, model=GPTConfig(seq_len=4, hidden=8))
    t_send = 1 * 4 * 8 * 4 / 1e9  # one fp32 activation, 128 bytes at 1e9 B/s
    p = predict(cfg, [(1.0, 2.0), (2.0, 4.0)], NET, optimizer_s=0.5)
    # 1F1B (Narayanan 2021 §2.2): m · T_max + Σ_{s≠max} T_s, plus the fill's 2(p−1) sends, plus the optimizer
    assert p["send_s"] == pytest.approx(t_send)
    assert p["breakdown_s"] == pytest.approx(
        {"compute": 4 * 6.0, "pp_bubble": 3.0, "pp_exposed": 2 * t_send, "optimizer": 0.5}
    )
    g = predict(PipelineBenchConfig((2, 2), "gpipe", 4, 1, model=cfg.model), [(1.0, 2.0), (2.0, 4.0)], NET)
    # GPipe: Σ T_s + (m−1)(max F + max B) = 9 + 3·6 = 27, bubble = 27 − 4·6
    assert g["breakdown_s"]["pp_bubble"] == pytest.approx(3.0)
    # the half-speed node's stages: 3,1 on a fast first node beats 2,2 (per-layer time 1 vs 2)
    even = predict(cfg, [(2.0, 4.0), (4.0, 8.0)], NET)["step_time_s"]
    shifted = predict(cfg, [(3.0, 6.0), (2.0, 4.0)], NET)["step_time_s"]
    assert shifted < even


def test_stage_params_hand_worked():
    c = GPTConfig(vocab=10, hidden=4, layers=3)
    cfg = PipelineBenchConfig((2, 1), model=c)
    block = 12 * 16 + 2 * 4
    assert stage_params(cfg, 0) == 2 * block + 10 * 4  # blocks + embedding
    assert stage_params(cfg, 1) == block + 4 + 10 * 4  # block + final norm + head


def test_bad_split_is_one_line(tmp_path):
    r = cli("bench", "pipeline", "--layers", "4", "--stage-layers", "3,2")
    assert r.returncode == 2 and "sum to --layers (4)" in r.stderr and "Traceback" not in r.stderr


def test_local_run_records_stages_and_prediction(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump(NET))
    out = tmp_path / "p.json"
    r = cli(
        "bench",
        "pipeline",
        "--layers",
        "2",
        "--stage-layers",
        "1,1",
        "--micro-batches",
        "2",
        "--micro-batch",
        "1",
        "--hidden",
        "32",
        "--seq-len",
        "8",
        "--steps",
        "2",
        "--warmup",
        "0",
        "--cluster",
        str(cluster),
        "--out",
        str(out),
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = records(out)
    assert rec["step_time_s"] > 0 and rec["predicted_step_time_s"] > 0 and len(rec["stages"]) == 2
    for st in rec["stages"]:
        assert st["compute_s"] > 0 and st["fwd_s"] > 0 and st["bwd_s"] > 0  # medians over steps, each on its own
    assert len(rec["step_times_s"]) == 2 and rec["host_load"]["cpus"] >= 1


@pytest.mark.netns
def test_node_speed_is_a_cgroup_quota_and_a_pool_per_node(tmp_path):
    require_netns()
    from commtax.measure import cgroups

    path = tmp_path / "cluster.yaml"
    r = cli("cluster", "up", "--nodes", "2", "--node-speed", "1,0.5", "--link", "1gbit,500mbit", "--out", str(path))
    assert r.returncode == 0, r.stderr
    try:
        spec = yaml.safe_load(path.read_text())
        assert [p["gpu"]["peak_tflops"]["fp32"] for p in spec["pools"]] == pytest.approx([0.1, 0.05])
        assert [p["inter_node"]["bw_Gbps"] for p in spec["pools"]] == pytest.approx([1.0, 0.5])
        assert spec["emulated"]["node_speed"] == [1.0, 0.5]
        kind, _ = cgroups.cpu_root()
        n1 = cgroups.path_of(spec["emulated"]["namespaces"][1])
        quota = (n1 / "cpu.max").read_text().split()[0] if kind == "v2" else (n1 / "cpu.cfs_quota_us").read_text()
        assert int(quota) == cgroups.PERIOD_US // 2  # half a CPU per period
        from commtax.spec import load_job

        job = load_job(
            {
                "model": {"name": "t", "layers": 4, "hidden": 64, "heads": 4, "vocab": 64, "source": "t"},
                "cluster": str(path),
                "plan": {"pp": 2, "stage_pools": ["n0", "n1"]},
                "training": {"seq_len": 16, "global_batch": 4, "precision": "fp32"},
            }
        )
        assert [p.gpu.name for p in job.cluster.pools] == ["cpu-gloo-x1", "cpu-gloo-x0.5"]
    finally:
        r = cli("cluster", "down", "--cluster", str(path))
    assert r.returncode == 0 and not n1.exists()
    json.dumps(spec)  # the cluster file is plain data
