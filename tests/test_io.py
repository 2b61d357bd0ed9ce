"""Atomic writes: what a reader finds at the final path."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import polars as pl

from slmserve import io


def test_results_get_a_plain_files_mode_not_mkstemps(tmp_path: Path, monkeypatch) -> None:
    current = os.umask(0o022)
    os.umask(current)
    assert current == io._UMASK  # the process's umask, read once at import
    # a fixed umask whose plain mode (0644) differs from mkstemp's 0600, whatever the caller's umask
    monkeypatch.setattr(io, "_UMASK", 0o022)
    plain = 0o644
    io.write_parquet(pl.DataFrame({"x": [1]}), tmp_path / "a.parquet", {"k": 1})
    io.atomic_write_text(tmp_path / "b.json", "{}")
    for name in ("a.parquet", "b.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == plain, name
    assert io.read_meta(tmp_path / "a.parquet") == {"k": 1}
    assert pl.read_parquet(tmp_path / "a.parquet")["x"].to_list() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.json"]  # no temporary file left
