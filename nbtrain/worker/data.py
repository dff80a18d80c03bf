"""Load training data with ``datasets`` and normalise every row to ``messages`` or ``text``."""

from __future__ import annotations

from typing import Any

from nbtrain.formats import RowError, detect_format, show_row, to_example


class DataError(ValueError):
    pass


def load_raw(location: str, kind: str) -> Any:
    import datasets

    if kind in ("jsonl", "json"):
        return datasets.load_dataset("json", data_files=location, split="train")
    if kind in ("csv", "parquet"):
        return datasets.load_dataset(kind, data_files=location, split="train")
    if kind == "disk":
        ds = datasets.load_from_disk(location)
        return ds["train"] if isinstance(ds, datasets.DatasetDict) else ds
    return datasets.load_dataset(location, split="train")


def normalise(ds: Any, fmt: str, *, max_samples: int | None = None) -> tuple[Any, str]:
    """Convert every row to the SFT form; raise DataError naming the first bad row."""
    if len(ds) == 0:
        raise DataError("the dataset has no rows")
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))
    if fmt == "auto":
        detected = detect_format(ds[0])
        if detected is None:
            raise DataError(f"row 1 matches no known format: {show_row(ds[0])}")
        fmt = detected

    def convert(row: dict[str, Any], idx: int) -> dict[str, Any]:
        try:
            return to_example(row, fmt)
        except RowError as e:
            raise DataError(f"row {idx + 1} is not valid {fmt} data ({e}): {show_row(row)}") from None

    out = ds.map(convert, with_indices=True, remove_columns=ds.column_names, desc=None)
    return out, fmt


def take_eval_split(train: Any, fraction: float, seed: int) -> tuple[Any, Any]:
    """Hold out ``fraction`` of the training rows for evaluation (seeded, so resume sees the same split)."""
    if len(train) < 2:
        raise DataError("eval_split needs at least 2 rows of training data")
    split = train.train_test_split(test_size=fraction, seed=seed)
    return split["train"], split["test"]
