"""Re-price older runs of measure.sh with a newer run's predictions for the same cases (same cluster shape, same
flows; only the model changed), e.g. the κ-priced runs of the last pass with the rendezvous model.

Usage: python reprice.py NEW.json OLD.json ... -> per old run: its all_to_all ratios and how many are within 15%."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(new: Path, old: list[Path]) -> None:
    pred = {(r["background"], r["op"], r["message_bytes"]): r["predicted_s"] for r in json.loads(new.read_text())}
    for f in old:
        rows = [r for r in json.loads(f.read_text()) if r["op"] == "all_to_all"]
        ratios = [
            (
                r["background"],
                r["message_bytes"] >> 20,
                r["measured_s"] / pred[r["background"], r["op"], r["message_bytes"]],
            )
            for r in rows
        ]
        inside = sum(abs(x - 1) <= 0.15 for _, _, x in ratios)
        each = ", ".join(f"{bg} {mib} MiB {x:.2f}" for bg, mib, x in ratios)
        print(f"{f.name}: all_to_all {inside} of {len(ratios)} within 15% ({each})")


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
