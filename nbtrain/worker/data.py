"""Load training data with ``datasets`` and normalise every row to what the objective's trainer takes.

One or several sources (``data: train:`` as a list) are each loaded, renamed (``columns:``) and
normalised with ``formats.to_example`` (so a bad row is named by its number in its own source), then
mixed: ``interleave_datasets`` with the sources' weights as probabilities (seeded), or concatenated
when no weights are given. ``data: streaming: true`` loads every source as an ``IterableDataset`` and
does the same lazily, so rows are read as training consumes them.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from nbtrain.contract.formats import (
    RowError,
    detect_format,
    is_conversational,
    jsonl_lines,
    show_row,
    to_example,
)
from nbtrain.contract.objectives import OBJECTIVES, padding_free_bins

Preprocess = Callable[[dict[str, Any]], dict[str, Any]]  # hooks: preprocess (nbtrain.worker.hooks)


class DataError(ValueError):
    pass


def load_raw(
    location: str,
    kind: str,
    *,
    split: str | None = None,
    streaming: bool = False,
    data_files: str | list[str] | None = None,
) -> Any:
    import datasets

    if kind in ("jsonl", "json", "csv", "parquet"):
        builder = "json" if kind in ("jsonl", "json") else kind
        if kind == "jsonl":
            check_lines(location)
        try:
            return datasets.load_dataset(builder, data_files=location, split="train", streaming=streaming)
        except Exception as e:  # datasets wraps every reader's error: name the file and the row
            raise DataError(unreadable(location, kind, e)) from e
    if kind == "disk":
        ds = datasets.load_from_disk(location)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split or "train"]
        # Arrow files on disk are memory-mapped already; as an iterable they are read in order, lazily.
        return ds.to_iterable_dataset() if streaming else ds
    return datasets.load_dataset(location, split=split or "train", data_files=data_files, streaming=streaming)


# A row with more brackets than this is parsed once more to make sure it is not nested too deeply for the
# readers below (pyarrow's JSON reader crashes the process on a row nested 100k deep).
_BRACKETS = 1000


def check_lines(location: str) -> None:
    """Every line of a local JSON-lines file within the row bound, UTF-8 and not nested too deeply, before
    ``datasets`` reads it: its JSON reader takes invalid UTF-8 silently (and fails only when a row is used,
    far from the file) and dies on a row nested 100k deep. One pass at readline speed; only a line with
    over ``_BRACKETS`` brackets is parsed here."""
    name = os.path.basename(location)
    try:
        for lineno, line in jsonl_lines(location):
            if line.count("[") + line.count("{") > _BRACKETS:
                try:
                    json.loads(line)
                except RecursionError:
                    raise DataError(
                        f"line {lineno} of {name} is nested too deeply to read; rows are flat objects of "
                        f"text fields (or lists of messages)"
                    ) from None
                except ValueError:
                    pass  # not JSON: datasets says so, and unreadable() names the line
    except RowError as e:
        raise DataError(str(e)) from None


def unreadable(location: str, kind: str, error: BaseException) -> str:
    """What to say when ``datasets`` cannot read a local file: the file, for JSON lines the first line that
    is not JSON, and the underlying cause (datasets wraps it in its own error)."""
    cause: BaseException = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
    name = os.path.basename(location)
    if kind == "jsonl":
        try:
            for lineno, line in jsonl_lines(location):
                try:
                    if line.strip():
                        json.loads(line)
                except RecursionError:
                    return f"line {lineno} of {name} is nested too deeply to read; rows are flat objects"
                except ValueError as e:
                    return f"line {lineno} of {name} is not valid JSON ({e}); fix or drop it"
        except RowError as e:
            return str(e)
    return (
        f"cannot read {location} as {kind}: {type(cause).__name__}: {str(cause)[:300]} (is it truncated or "
        f"corrupt? write it again)"
    )


def is_streaming(ds: Any) -> bool:
    import datasets

    return isinstance(ds, datasets.IterableDataset)


def first_row(ds: Any) -> dict[str, Any] | None:
    if is_streaming(ds):
        return next(iter(ds.take(1)), None)
    return ds[0] if len(ds) else None


def convert(
    ds: Any,
    fmt: str,
    objective: str = "sft",
    *,
    max_samples: int | None = None,
    source: str = "",
    vision: bool = False,
    base: str | None = None,
    tags: Mapping[str, str] | None = None,
    mask_history: bool = False,
) -> tuple[Any, str]:
    """Normalise every row of ``ds`` (a Dataset or an IterableDataset) to ``fmt`` for ``objective``
    (detected from the first row when 'auto'); DataError naming the first bad row. Prompt rows keep
    their other columns: GRPO hands them to the reward functions. ``vision``: every row in TRL's vision
    layout, its images found (paths relative to ``base``, the data file's folder), checked to be images
    and typed as ``datasets.Image`` (decoded as the trainer reads them). ``tags``: a LLaMA-Factory
    dataset's sharegpt names (the kernel read them from its dataset_info.json into resolved.json);
    ``mask_history``: conversations train on their last assistant turn only (contract/formats)."""
    where = f" of {source}" if source else ""
    if max_samples is not None:
        ds = ds.take(max_samples) if is_streaming(ds) else ds.select(range(min(max_samples, len(ds))))
    first = first_row(ds)
    if first is None:
        raise DataError(f"the dataset{where} has no rows")
    if fmt == "auto":
        detected = detect_format(first, objective)
        if detected is None:
            usable = ", ".join(OBJECTIVES[objective].formats)
            raise DataError(
                f"row 1{where} is not data objective: {objective} trains on ({usable}): {show_row(first)}"
            )
        fmt = detected
    use = fmt
    rich = objective == "sft" and fmt in CONVERSATIONAL and not vision

    def one(row: dict[str, Any], idx: int) -> dict[str, Any]:
        try:
            example = to_example(row, use, vision=vision, tags=tags, mask_history=mask_history)
        except RowError as e:
            raise DataError(f"row {idx + 1}{where} is not valid {use} data ({e}): {show_row(row)}") from None
        if vision:
            example["images"] = [image_entry(ref, base, f"row {idx + 1}{where}") for ref in example["images"]]
        elif rich:
            tools = example.get("tools")
            example["tools"] = json.dumps(tools, ensure_ascii=False) if tools else None
        return example

    # A streamed dataset may not know its columns before it is read: the first row does.
    columns = ds.column_names if ds.column_names is not None else list(first)
    remove = [] if fmt == "prompt" else columns
    kwargs: dict[str, Any] = {} if is_streaming(ds) else {"desc": None}
    if vision:
        kwargs["features"] = vision_features(fmt)
    elif rich:
        kwargs["features"] = conversation_features()
    return ds.map(one, with_indices=True, remove_columns=remove, **kwargs), fmt


# SFT formats whose rows become conversations (``messages``, and ``tools`` when the row has any).
CONVERSATIONAL = ("messages", "alpaca", "sharegpt")


def conversation_features() -> Any:
    """The columns of an SFT run's conversational rows. Each message is stored as JSON (``datasets.Json``):
    a tool call's arguments differ from row to row, and a message's keys from turn to turn (``tool_calls``,
    ``name``, ``tool_call_id``, ``train``), which one Arrow struct type cannot hold. ``tools`` is the row's
    function schemas as a JSON string, or null (TRL's SFTTrainer parses it and hands it to
    ``apply_chat_template(tools=...)``; so does ``masks.py``)."""
    import datasets

    return datasets.Features({"messages": datasets.List(datasets.Json()), "tools": datasets.Value("string")})


def vision_features(fmt: str) -> Any:
    """The columns of a vision-language run's rows: turns of content parts (``messages``, or a preference
    row's ``prompt``/``chosen``/``rejected``), and the images as ``datasets.Image`` (stored as path or
    bytes; decoded when a batch is collated)."""
    import datasets

    part = {"type": datasets.Value("string"), "text": datasets.Value("string")}
    turns = datasets.List({"role": datasets.Value("string"), "content": datasets.List(part)})
    keys = {"preference": ("prompt", "chosen", "rejected"), "unpaired": ("prompt", "completion")}
    columns: dict[str, Any] = {k: turns for k in keys.get(fmt, ("messages",))}
    if fmt == "unpaired":
        columns["label"] = datasets.Value("bool")
    return datasets.Features({**columns, "images": datasets.List(datasets.Image())})


class ImageRowsFirst:
    """A vision collator that is handed a batch's rows with images first. TRL's collator fails on a batch
    whose first row has no image (transformers infers each field's tensor type from the first row:
    "Unable to convert output 'text_replacement_offsets'"); rows are independent, so the order is free."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, rows: list[dict[str, Any]]) -> Any:
        return self.collate(sorted(rows, key=lambda row: not row.get("images")))


class PaddingFreeWhereCheaper:
    """SFT's collator when the plan chose padding-free batches (plan: padding_free): each batch's rows are
    laid end to end in as many sequences as cost least (contract/objectives.padding_free_bins, from the
    model's facts: position_ids restarting at each row, no attention mask, the shorter sequences padded
    with positions of their own), or padded as usual where that is cheaper. Every layout builds the same
    labels, so the loss is the same; only the padding's cost goes. The first batch of each layout is
    reported in the log."""

    # only flash-attention's varlen kernels read these; the dense paths would receive them as unknown kwargs
    VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")

    def __init__(self, padded: Any, model: Any, pad_token_id: int, pad_to_multiple_of: int | None) -> None:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        self.padded = padded
        self.pad_token_id = pad_token_id
        self.flat = DataCollatorForLanguageModeling(
            pad_token_id=pad_token_id, padding_free=True, pad_to_multiple_of=pad_to_multiple_of
        )
        self.facts = model_attention_facts(model)
        self.seen: set[int] = set()

    def __call__(self, rows: list[dict[str, Any]]) -> Any:
        lengths = [len(row["input_ids"]) for row in rows]
        bins = padding_free_bins(lengths, **self.facts)
        self._report(lengths, bins)
        if bins is None:
            return self.padded(rows)
        if len(bins) == 1:
            batch = self.flat(rows)
            if not self.facts["varlen"]:
                for key in self.VARLEN_KEYS:
                    batch.pop(key, None)
            return batch
        return self._stacked([self.flat([rows[i] for i in b]) for b in bins])

    def _stacked(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """Sequences of rows laid end to end, one a batch row, the shorter ones padded at the end: padding
        ids, no label, position 0 (each padding position then a sequence of its own, seen by nothing)."""
        import torch

        width = max(int(p["input_ids"].shape[1]) for p in parts)
        fill = {"input_ids": self.pad_token_id, "labels": -100, "position_ids": 0}
        return {
            key: torch.cat(
                [torch.nn.functional.pad(p[key], (0, width - p[key].shape[1]), value=value) for p in parts]
            )
            for key, value in fill.items()
        }

    def _report(self, lengths: list[int], bins: list[list[int]] | None) -> None:
        k = 0 if bins is None else len(bins)
        if k in self.seen:
            return
        self.seen.add(k)
        if bins is None:
            how = "padded (cheaper than padding-free here)"
        else:
            how = f"laid end to end (padding-free) in {k} sequence{'s' if k > 1 else ''}"
        print(
            f"nbtrain: a batch of {len(lengths)} rows, {sum(lengths):,} tokens "
            f"({len(lengths) * max(lengths):,} padded): {how}",
            flush=True,
        )


def model_attention_facts(model: Any) -> dict[str, Any]:
    """What padding_free_bins weighs, from the model: its decoder layers' weights (a layer's share of
    every weight matrix outside the embeddings and the LM head; ZeRO-3's full sizes), the attention's
    width and heads, the layers, and whether the attention is flash-attention's (varlen)."""
    config = model.config.get_text_config()
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    weights = sum(
        int(getattr(p, "ds_numel", p.numel()))
        for name, p in model.named_parameters()
        if p.dim() >= 2
        and "embed" not in name
        and "lm_head" not in name
        and name.rpartition(".")[2] not in ("wte", "wpe")
    )
    attn = str(getattr(model.config, "_attn_implementation", None) or "sdpa")
    return {
        "layer_params": weights // max(layers, 1),
        "attention_width": heads * int(head_dim),
        "heads": heads,
        "layers": layers,
        "varlen": attn.startswith("flash_attention"),
    }


# An image a row names by URL is fetched once, while the rows are prepared; larger ones are refused.
MAX_IMAGE_BYTES = 64 * 2**20
URL_TIMEOUT = 30.0


def image_entry(ref: Any, base: str | None, where: str) -> dict[str, Any]:
    """One image of a row as ``datasets.Image`` stores it (``{"path", "bytes"}``), after checking that it is
    there and is an image; DataError naming the row and the image otherwise."""
    import io

    from PIL import Image, UnidentifiedImageError

    from nbtrain.contract.images import ImageRowError, describe, image_source, too_many_pixels

    try:
        kind, value = image_source(ref, base)
    except ImageRowError as e:
        raise DataError(f"{where}: {e}") from None
    name = describe(ref)
    if kind == "object":
        if not isinstance(value, Image.Image):
            raise DataError(f"{where}: an image is a {type(value).__name__}, not a path, URL or image")
        buf = io.BytesIO()
        value.save(buf, format="PNG")
        return {"path": None, "bytes": buf.getvalue()}
    if kind == "url":
        value = fetch_image(value, where)
        kind = "bytes"
    if kind == "path" and not os.path.isfile(value):
        raise DataError(f"{where}: the image {name} is not there (looked for {value}); fix or remove the row")
    try:
        with Image.open(value if kind == "path" else io.BytesIO(value)) as im:
            if too_big := too_many_pixels(im.width, im.height):  # from the header: nothing decoded yet
                raise DataError(f"{where}: the image {name} {too_big}; scale it down or remove the row")
            im.verify()
    except DataError:
        raise
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as e:
        raise DataError(
            f"{where}: the image {name} is not a readable image ({type(e).__name__}: {str(e)[:200]}); fix or "
            f"remove the row"
        ) from None
    return {"path": value, "bytes": None} if kind == "path" else {"path": None, "bytes": value}


def fetch_image(url: str, where: str) -> bytes:
    """The bytes of an image a row names by URL: its host checked first (contract.images.url_problem, each
    redirect too), at most MAX_IMAGE_BYTES, all within URL_TIMEOUT s -- one deadline for the whole fetch,
    the connection, the status line and headers included, so a host that trickles any of it a byte at a
    time ends with the others. The URL's user name and password are in no message."""
    import urllib.request

    from nbtrain.contract.images import describe, hide_credentials, url_problem

    shown = describe(url)

    class CheckedRedirects(urllib.request.HTTPRedirectHandler):
        """Redirects followed only to hosts the policy allows (a public host may redirect to loopback)."""

        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            why = url_problem(newurl)
            if why:
                raise DataError(f"{where}: the image {shown} redirects to {describe(newurl)}, which {why}")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    why = url_problem(url)
    if why:
        raise DataError(f"{where}: the image {shown} {why}")
    deadline = time.monotonic() + URL_TIMEOUT

    def late(size: int) -> DataError:
        return DataError(
            f"{where}: the image {shown} took over {URL_TIMEOUT:g} s to fetch ({size} bytes came); fetch it "
            f"yourself and give its path, or remove the row"
        )

    chunks: list[bytes] = []
    size = 0
    opener = urllib.request.build_opener(CheckedRedirects(), *_deadline_handlers(deadline))
    try:
        with opener.open(url, timeout=URL_TIMEOUT) as resp:  # image_source: http(s) only
            while size <= MAX_IMAGE_BYTES:
                if time.monotonic() > deadline:
                    raise late(size)
                chunk = resp.read1(65536)  # what one read of the socket gives (read() waits for all)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except (OSError, http.client.HTTPException) as e:
        if time.monotonic() >= deadline:
            raise late(size) from None
        error = hide_credentials(str(e), url)
        raise DataError(f"{where}: the image {shown} could not be fetched ({error})") from None
    data = b"".join(chunks)
    if len(data) > MAX_IMAGE_BYTES:
        raise DataError(f"{where}: the image {shown} is over {MAX_IMAGE_BYTES // 2**20} MiB")
    return data


class _DeadlineSocket:
    """A socket whose every read waits at most until ``deadline`` (time.monotonic): the time left is its
    timeout before each read, and none is left after it. Mixed into socket.socket for http and into the
    SSL socket class for https, below http.client, which reads the status line and each header line by
    line (a per-read timeout alone lets a byte every few seconds go on for ever)."""

    deadline = math.inf

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the fetch's deadline passed")
        self.settimeout(left)  # type: ignore[attr-defined]

    def recv(self, *args: Any) -> bytes:
        self._arm()
        return super().recv(*args)  # type: ignore[misc]

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return super().recv_into(*args)  # type: ignore[misc]


class _DeadlinePlainSocket(_DeadlineSocket, socket.socket):
    pass


class _DeadlineSSLSocket(_DeadlineSocket, ssl.SSLSocket):
    pass


def _deadline_handlers(deadline: float) -> list[Any]:
    """urllib's http and https handlers with every connection held to ``deadline``: the TCP connect and the
    TLS handshake get the time left as their timeout, every read after them the time then left."""
    import urllib.request

    def connect(
        address: Any, timeout: Any = None, source_address: Any = None, **kwargs: Any
    ) -> socket.socket:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the fetch's deadline passed")
        raw = socket.create_connection(address, left, source_address)
        sock = _DeadlinePlainSocket(fileno=raw.detach())
        sock.deadline = deadline
        sock._arm()  # the TLS handshake, if any, reads under this timeout
        return sock

    class HTTP(http.client.HTTPConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = connect

    class HTTPS(http.client.HTTPSConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = connect

        def connect(self) -> None:
            super().connect()
            if isinstance(self.sock, _DeadlineSocket):
                self.sock.deadline = deadline

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(HTTP, req)

    context = ssl.create_default_context()
    context.sslsocket_class = _DeadlineSSLSocket

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(HTTPS, req, context=context)

    return [HTTPHandler(), HTTPSHandler(context=context)]


def preprocessed(ds: Any, preprocess: Preprocess | None) -> Any:
    """``hooks: preprocess`` mapped over the rows as they are in the file (before data: columns: and the
    format; the columns it returns replace or add to the row's). A stream maps lazily, as it is read."""
    if preprocess is None:
        return ds
    return ds.map(preprocess, **({} if is_streaming(ds) else {"desc": None}))


def rename_columns(ds: Any, columns: Mapping[str, str] | None) -> Any:
    """Apply ``data: columns: {canonical: column}`` to a dataset, as formats.apply_columns does to a row."""
    names = ds.column_names
    if names is None and columns:
        names = list(first_row(ds) or {})
    for canonical, column in (columns or {}).items():
        if column == canonical:
            continue
        if column not in names:
            raise DataError(
                f"data: columns: maps {canonical}: {column}, but the data has no column {column!r} "
                f"(its columns: {names})"
            )
        if canonical in names:
            ds = ds.remove_columns(canonical)  # the mapped column wins, as in the kernel's check
            names = [n for n in names if n != canonical]
        ds = ds.rename_column(column, canonical)
        names = [canonical if n == column else n for n in names]
    return ds


def mix(parts: list[Any], weights: list[float] | None, seed: int, stopping_strategy: str) -> Any:
    """One dataset from several normalised ones: interleaved by weight, or concatenated."""
    import datasets

    if len(parts) == 1:
        return parts[0]
    try:
        if weights is not None:
            total = sum(weights)
            return datasets.interleave_datasets(
                parts,
                probabilities=[w / total for w in weights],
                seed=seed,
                stopping_strategy=stopping_strategy,
            )
        return datasets.concatenate_datasets(parts)
    except ValueError as e:  # features that do not align (e.g. string prompts with message lists)
        raise DataError(
            f"the data: train: sources cannot be mixed: {e}. Give every source rows of one shape (all "
            f"conversations or all plain strings, the same fields)"
        ) from None


def load_train(
    cfg: Mapping[str, Any],
    data: Mapping[str, Any],
    objective: str,
    seed: int,
    *,
    limit: int | None = None,
    preprocess: Preprocess | None = None,
) -> tuple[Any, str, list[str]]:
    """The training data of a resolved run: every source loaded, normalised and mixed. ``limit`` reads
    only the first rows of each source (the preview); ``preprocess``: the run's ``hooks: preprocess``.

    Returns (dataset, format of the first source, one description per source for the log).
    """
    d = cfg["data"]
    streaming = bool(d.get("streaming"))
    sources = data.get("sources") or [data["train"]]
    parts, weights, described = [], [], []
    fmt = "auto"
    for i, src in enumerate(sources):
        name = src.get("spec") or src["location"]
        label = name if len(sources) > 1 else ""
        raw = load_raw(
            src["location"], src["kind"], split=src.get("split"), streaming=streaming,
            data_files=src.get("data_files"),
        )  # fmt: skip
        raw = rename_columns(preprocessed(raw, preprocess), src.get("columns") or d.get("columns"))
        # The kernel resolved each source's format from a sample; a hub source says "auto".
        src_fmt = src.get("format") or "auto"
        if src_fmt == "auto":
            src_fmt = d.get("format", "auto")
        part, used = convert(
            raw, src_fmt, objective, source=label, max_samples=limit, vision=bool(cfg.get("vision")),
            base=_folder(src), tags=src.get("tags"), mask_history=bool(d.get("mask_history")),
        )  # fmt: skip
        if i == 0:
            fmt = used
        parts.append(part)
        weights.append(src.get("weight"))
        described.append(f"{name} ({used}" + (f", weight {src['weight']:g})" if src.get("weight") else ")"))
    mixed = mix(
        parts,
        None if weights[0] is None else [float(w) for w in weights],
        seed,
        str(d.get("stopping_strategy") or "all_exhausted"),
    )
    max_samples = d.get("max_samples")
    if max_samples is not None:
        mixed = mixed.take(max_samples) if streaming else mixed.select(range(min(max_samples, len(mixed))))
    return mixed, fmt, described


def load_eval(
    cfg: Mapping[str, Any],
    data: Mapping[str, Any],
    fmt: str,
    objective: str,
    preprocess: Preprocess | None = None,
) -> Any:
    """The eval: file, normalised like the training data, or None."""
    ev = data.get("eval")
    if not ev:
        return None
    d = cfg["data"]
    raw = load_raw(ev["location"], ev["kind"], streaming=bool(d.get("streaming")))
    vision = bool(cfg.get("vision"))
    raw = rename_columns(preprocessed(raw, preprocess), d.get("columns"))
    out, _ = convert(
        raw, fmt, objective, vision=vision, base=_folder(ev), mask_history=bool(d.get("mask_history"))
    )
    return out


def _folder(src: Mapping[str, Any]) -> str | None:
    """Where a source's relative image paths start: its file's folder (a save_to_disk dir: itself)."""
    if src.get("kind") == "disk":
        return str(src["location"])
    if src.get("kind") in ("jsonl", "json", "csv", "parquet"):
        return os.path.dirname(str(src["location"]))
    return None


def take_eval_split(train: Any, size: float | int, seed: int) -> tuple[Any, Any]:
    """Hold out ``size`` (a fraction, or a number of rows) of the training rows for evaluation (seeded,
    so resume sees the same split). A stream holds out its first ``size`` rows."""
    if is_streaming(train):
        if not isinstance(size, int):
            raise DataError("a streamed dataset has no known length: give eval_split as a number of rows")
        return train.skip(size), train.take(size)
    if len(train) < 2:
        raise DataError("eval_split needs at least 2 rows of training data")
    if isinstance(size, int) and size >= len(train):
        raise DataError(f"eval_split: {size} rows, but the training data has only {len(train)}")
    split = train.train_test_split(test_size=size, seed=seed)
    return split["train"], split["test"]


def load_for_training(
    cfg: Mapping[str, Any],
    data: Mapping[str, Any],
    objective: str,
    seed: int,
    tok: Any,
    preprocess: Preprocess | None = None,
) -> tuple[Any, Any]:
    """(train, eval) for a recipe, checked against the tokenizer (``preprocess``: the run's ``hooks:
    preprocess``); prints what was loaded."""
    train, fmt, described = load_train(cfg, data, objective, seed, preprocess=preprocess)
    row = first_row(train)
    if row is not None and is_conversational(row) and not getattr(tok, "chat_template", None):
        raise DataError(
            f"the data is conversational ({fmt}: lists of messages) but the tokenizer of {cfg['model']} has "
            f"no chat template; use a chat model, or give plain text rows (format: text, or plain strings)"
        )
    d = cfg["data"]
    evald = load_eval(cfg, data, fmt, objective, preprocess)
    if evald is None and d.get("eval_split"):
        train, evald = take_eval_split(train, d["eval_split"], seed)
    prefix = "" if objective == "sft" else f"{objective}: "
    rows = "streaming training rows" if is_streaming(train) else f"{len(train)} training rows"
    if len(described) > 1:
        how = "mixed by weight" if data.get("sources", [{}])[0].get("weight") else "concatenated"
        rows += f" from {len(described)} sources {how}: {', '.join(described)}"
    else:
        rows += f" ({fmt})"
    ev = ""
    if evald is not None:
        ev = ", streaming eval rows" if is_streaming(evald) else f", {len(evald)} eval rows"
    print(f"nbtrain: {prefix}{rows}{ev}", flush=True)
    return train, evald
