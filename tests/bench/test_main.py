"""bench/__main__.py's results table (what README's "Performance" section shows)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.__main__ import table


def test_table_summarises_each_result_with_its_date_and_flags_an_unknown_shape(tmp_path: Path) -> None:
    (tmp_path / "latency.json").write_text(json.dumps({
        "date": "2026-01-02 03:04 UTC", "p50_ratio": 1.25, "p95_ratio": 2.0,
        "idle": {"p50_ms": 4.0, "p95_ms": 6.0}, "dashboard": {"p50_ms": 5.0, "p95_ms": 12.0},
        "dashboard_updates_during_measurement": 17,
    }))  # fmt: skip
    (tmp_path / "scaling.json").write_text(json.dumps({"median": {"1 rank": 1}}))  # an older shape
    (tmp_path / "newbench.json").write_text(json.dumps({"x": 1}))
    text = table(tmp_path)
    rows = text.splitlines()
    latency = next(r for r in rows if "latency.json" in r)
    assert "p50 5.0 vs 4.0 ms (1.25x)" in latency and "p95 12.0 vs 6.0 ms (2.00x)" in latency
    assert "17 figure updates" in latency and "2026-01-02" in latency
    scaling = next(r for r in rows if "scaling.json" in r)
    assert "see the file (no summary: TypeError" in scaling
    assert any(r.startswith("| newbench | see the file |") for r in rows)
    assert rows[-1].startswith("| GPU section (bench/gpu.py) | not measured")


def test_table_lists_gpu_rows_when_the_gpu_section_ran(tmp_path: Path) -> None:
    row = {"size": "7b", "method": "qlora", "mode": "nbtrain auto", "tokens_per_s": 1234.4,
           "peak_bytes": 3 * 2**30, "micro_batch": 16, "grad_accum": 2, "mfu": 0.4567}  # fmt: skip
    (tmp_path / "gpu.json").write_text(json.dumps({"machine": "1 x H200", "rows": [row]}))
    text = table(tmp_path)
    want = "| GPU 7b qlora, nbtrain auto | 1234 tok/s, peak 3.0 GiB, batch 16x2, MFU 45.7% | 1 x H200 |"
    assert want in text
    assert "not measured" not in text
