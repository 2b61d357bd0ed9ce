"""Atomic writes: what a reader finds at the final path."""

from __future__ import annotations

import os
import stat
import tempfile
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


def test_a_folder_removed_by_another_job_before_the_write_is_made_again(tmp_path: Path, monkeypatch) -> None:
    """Another job empties and removes a shared ``.partial/`` (journal.discard_saved) between this write's
    mkdir and its temporary file: the write makes the folder again instead of failing after the measurement."""
    real = tempfile.mkstemp
    removed: list[Path] = []

    def racing(*a: object, **kw: object) -> tuple[int, str]:
        if not removed:  # the other job's rmdir lands just before the first temporary file
            folder = Path(str(kw["dir"]))
            folder.rmdir()
            removed.append(folder)
        return real(*a, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(tempfile, "mkstemp", racing)
    io.write_parquet(pl.DataFrame({"x": [1]}), tmp_path / ".partial" / "a.parquet", {"k": 1})
    assert removed == [tmp_path / ".partial"] and io.read_meta(tmp_path / ".partial" / "a.parquet") == {"k": 1}
