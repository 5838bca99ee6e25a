"""The public MoE runs (shared/validation/public_moe_runs.csv): every row predicted, MAPE gated like the dense set."""

import pytest

from commtax.decide.validate import moe_layers_cell, validate
from commtax.errors import SpecError

# issue 18 asks for ≤ 15% source-averaged; the model reaches 31% today (docs/moe.md "Validation"): this gate holds
# the figure where it is so that a change that makes it worse fails, until the goal is met
MOE_MAPE_GATE = 33.0
MOE_MAPE_GOAL = 15.0


def test_public_moe_runs_all_predicted_and_gated(validation_dir):
    report = validate(validation_dir / "public_moe_runs.csv")
    assert len(report.rows) == 38
    assert report.refused == [], [r.reason for r in report.rows if r.reason]
    assert report.source_avg_mape_pct == pytest.approx(sum(report.by_source.values()) / len(report.by_source))
    assert report.source_avg_mape_pct <= MOE_MAPE_GATE
    assert report.fitted == {} or all(not any(i.startswith("mb2") for i in ids) for ids in report.fitted.values())


def test_moe_layers_column():
    assert moe_layers_cell("first_k_dense=3") == {"moe_layers": "all", "first_k_dense": 3}
    assert moe_layers_cell("alternate") == {"moe_layers": "alternate"}
    with pytest.raises(SpecError, match="column moe_layers"):
        moe_layers_cell("every-third")
