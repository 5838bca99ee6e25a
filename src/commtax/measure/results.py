"""Benchmark records on disk: every finished measurement survives a crash.

Each ``append`` rewrites the JSON list and the CSV beside it atomically (temp file + fsync +
``os.replace``), so a reader — or a rank dying in the next measurement — never sees a
half-written file. Records follow nccl-tests (doc/PERFORMANCE.md): ``message_bytes`` is the
whole buffer, algbw = bytes / time, busbw = algbw × bus factor, both in GB/s (10^9).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from commtax.atomic import strict_json, write_atomic

REQUIRED_FIELDS = ("op", "impl", "backend", "world_size", "message_bytes", "time_s", "algbw_GBps", "busbw_GBps")


def to_csv(records: list[dict]) -> str:
    fields = list(REQUIRED_FIELDS) + sorted({k for r in records for k in r} - set(REQUIRED_FIELDS))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(records)
    return buf.getvalue()


class ResultFile:
    """A JSON list of records (and the same as CSV) that grows one record at a time."""

    def __init__(self, json_path: Path | str | None, append: bool = False):
        self.json_path = Path(json_path) if json_path else None
        self.csv_path = self.json_path.with_suffix(".csv") if self.json_path else None
        self.records: list[dict] = []
        if self.json_path and append and self.json_path.exists():
            self.records = load_records(self.json_path)

    def append(self, record: dict) -> None:
        self.records.append(record)
        if self.json_path is None:
            return
        write_atomic(self.json_path, strict_json(self.records, indent=1) + "\n")
        write_atomic(self.csv_path, to_csv(self.records))


def rank_sink(json_path: Path | str | None, append: bool = False) -> ResultFile:
    """Where a rank of a bench under torchrun puts its records: rank 0 writes them to ``json_path``, the other ranks
    keep them in memory (one writer per file)."""
    import os

    return ResultFile(json_path if int(os.environ["RANK"]) == 0 else None, append)


def load_records(path: Path | str) -> list[dict]:
    """Records from a bench JSON file; a missing required field names the record and the field."""
    from commtax.measure.calibrate import check_records
    from commtax.spec.files import read_json

    data = read_json(path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of bench records")
    for i, r in enumerate(data):
        if not isinstance(r, dict):
            raise ValueError(f"{path}: record {i} is not a mapping (a bench record from `commtax bench --out`)")
        missing = [k for k in REQUIRED_FIELDS if k not in r and r.get("op") != "gemm"]
        if missing:
            raise ValueError(f"{path}: record {i} lacks {', '.join(missing)}")
    return check_records(data, path)
