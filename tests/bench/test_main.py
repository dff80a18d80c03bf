"""bench/__main__.py's results table (bench/results/README.md; docs/performance.md shows its headlines)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.__main__ import table, write_table


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


def test_table_summarises_msswift_as_nbtrain_over_ms_swift(tmp_path: Path) -> None:
    keys = ("first_step_s", "steady_steps_per_s", "peak_rss", "final_loss")
    med = {s: dict(zip(keys, v, strict=True)) for s, v in {
        "msswift": (20.0, 10.0, 1600 * 2**20, 6.18), "nbtrain": (5.0, 90.0, 520 * 2**20, 6.182),
        "nbtrain_warm": (1.0, 80.0, 440 * 2**20, 6.182), "llamafactory": (6.0, 85.0, 650 * 2**20, 5.84),
        "bare_trl": (5.5, 88.0, 610 * 2**20, 6.182)}.items()}  # fmt: skip
    sw = med["msswift"]
    vs = {s: {"first_step": m["first_step_s"] / sw["first_step_s"],
              "peak_rss": m["peak_rss"] / sw["peak_rss"],
              "steps_per_s": m["steady_steps_per_s"] / sw["steady_steps_per_s"]}
          for s, m in med.items()
          if s != "msswift"}  # fmt: skip
    (tmp_path / "msswift.json").write_text(json.dumps({"date": "2026-12-02 18:00 UTC", "steps": 40,
                                                       "median": med, "vs_msswift": vs}))  # fmt: skip
    rows = [r for r in table(tmp_path).splitlines() if "msswift.json, 2026-12-02" in r]
    assert len(rows) == 2, rows
    assert "warm 0.05x, cold 0.25x of ms-swift's 20.0 s (LLaMA-Factory 0.30x, bare TRL 0.28x)" in rows[0]
    assert "steps/s (median step) cold 9.00x, warm 8.00x of ms-swift's 10.0" in rows[1]
    assert "peak RSS cold 0.33x, warm 0.28x of 1600 MiB; final loss 6.182 vs 6.180" in rows[1]


def test_rewriting_the_table_keeps_the_hand_written_notes(tmp_path: Path) -> None:
    (tmp_path / "newbench.json").write_text(json.dumps({"x": 1}))
    (tmp_path / "README.md").write_text(
        "# Benchmark results\n\n| old table |\n\n## Notes\n\n- a dated note\n"
    )
    write_table(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "| old table |" not in text and "| newbench | see the file |" in text
    assert text.endswith("## Notes\n\n- a dated note\n")
