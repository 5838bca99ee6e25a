"""Megatron-Bridge's matched recompute-module runs of Moonlight-16B on 8 H100 against the model (docs/moe.md).

    PYTHONPATH=src .venv/bin/python benchmarks/moonlight_recompute.py

Measured: NVIDIA-NeMo/Megatron-Bridge skills/nemo-mbridge-perf-activation-recompute/SKILL.md @5789a7a, "Matched H100
Evidence: Moonlight 16B" (2026-08-12: BF16, seq 4096, MBS 1, GBS 4, TP2 PP1 EP8, mean of iterations 11-20, only
recompute_modules changing). The architecture: moonshotai/Moonlight-16B-A3B config.json as Megatron-Bridge's
Moonlight provider reads it (27 layers, the first dense; MLA, kv_lora_rank 512, no q LoRA; 64 experts, top-6, 2
shared experts of 1408). Prints the predicted and measured step time of each module set and its change over [].
"""

from __future__ import annotations

from commtax.schedule.analytical import estimate
from commtax.spec import load_job

MOONLIGHT = {
    "name": "moonlight-16b-a3b",
    "layers": 27,
    "hidden": 2048,
    "heads": 16,
    "kv_heads": 16,
    "ffn_hidden": 11264,
    "vocab": 163840,
    "gated_mlp": True,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts": 64,
    "top_k": 6,
    "moe_ffn_hidden": 1408,
    "shared_experts": 2,
    "first_k_dense": 1,
    "source": "moonshotai/Moonlight-16B-A3B config.json (Megatron-Bridge recipes/moonlight)",
}
# (recompute_modules, measured step ms)
MEASURED = [
    ((), 457.18),
    (("core_attn",), 474.80),
    (("mla_up_proj",), 480.89),
    (("mla_up_proj", "mlp"), 496.73),
    (("moe_act",), 466.26),
    (("layernorm", "moe_act"), 506.53),
]


def job(modules: tuple[str, ...]):
    return load_job(
        {
            "model": MOONLIGHT,
            "cluster": {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr", "num_gpus": 8},
            "plan": {
                "framework": "megatron-core",
                "tp": 2,
                "ep": 8,
                "sequence_parallel": True,
                "recompute": "selective",
                "recompute_modules": list(modules),
                "grad_comm_dtype": "bf16",
            },
            "training": {"seq_len": 4096, "global_batch": 4, "precision": "bf16"},
        }
    )


def main() -> None:
    base_pred = estimate(job(())).step_time_s * 1e3
    base_meas = MEASURED[0][1]
    print("| recompute_modules | predicted ms | vs [] | measured ms | vs [] |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for modules, measured in MEASURED:
        pred = estimate(job(modules)).step_time_s * 1e3
        name = ", ".join(modules) or "[]"
        print(
            f"| {name} | {pred:.1f} | {100 * (pred / base_pred - 1):+.2f}% | {measured:.1f} | "
            f"{100 * (measured / base_meas - 1):+.2f}% |"
        )


if __name__ == "__main__":
    main()
