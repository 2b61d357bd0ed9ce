"""Repeats measured so far of a job's points, kept while the job runs so that a job stopped part-way (a machine
taken back, a SLURM time limit, Ctrl-C, a server that died) measures only the repeats it is missing when it
runs again.

A repeat is saved as soon as it ends, beside the point's result files:
``<folder>/.partial/<point>.r<k>.requests.parquet`` and ``.telemetry.parquet`` (atomic writes). Nothing there
looks like a result: the DAG, the summaries and the figures read only the point's own files, which are written
once every repeat is in, after which its saved repeats are deleted.

Each saved repeat carries the hash of the point's settings (:func:`settings_key`: the run description without
the repeat count and budget, which do not change what one repeat measures). A rerun takes the saved repeats
whose hash matches, in order from ``r0`` until the first gap; the other readable ones (other settings, or
after the gap) are measurements all the same and move to ``.partial/set-aside/`` (named with their settings
hash), which nothing reads; a file cut short holds no repeat and is deleted. Each repeat records the
machine it ran on (``machine`` in its metadata, :func:`slmserve.machine.machine_id`); one taken from a journal
also keeps the provenance of the point it measured (``provenance``, ``resumed: true``), so a point whose
repeats come from two machines says so (``n_machines`` in the summary). A point never mixes GPU models or
engine versions: saved repeats of another one stop the job with :class:`ResumeMismatch` instead.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from slmserve import io
from slmserve.measure import Measurement
from slmserve.provenance import config_hash, kind_differences

log = logging.getLogger(__name__)

DIR = ".partial"
SET_ASIDE = "set-aside"  # inside DIR: saved repeats no job resumes, kept for whoever changed the settings
# Settings that decide how many repeats a point gets, not what one repeat measures.
NOT_IN_KEY = ("repeats", "repeat_budget_s", "batch_sizes")


class ResumeMismatch(RuntimeError):
    """Saved repeats were measured on another GPU model or engine version than this job's."""


def settings_key(run: Mapping[str, Any]) -> str:
    """The hash of ``run`` (a point's run description) without :data:`NOT_IN_KEY` (``provenance.config_hash``)."""
    return config_hash({k: v for k, v in run.items() if k not in NOT_IN_KEY})


def _stem(requests_path: Path) -> str:
    return requests_path.name.removesuffix(".parquet").removesuffix(".requests")


def partial_paths(paths: tuple[Path, Path], k: int) -> tuple[Path, Path]:
    """Where repeat ``k`` of the point whose result files are ``paths`` (requests, telemetry) is kept."""
    where = paths[0].parent / DIR
    stem = _stem(paths[0])
    return where / f"{stem}.r{k}.requests.parquet", where / f"{stem}.r{k}.telemetry.parquet"


def _repeat_of(saved: Path) -> str:
    """``bs1.r0`` of a saved file ``bs1.r0.requests.parquet`` (or its ``.telemetry.parquet``)."""
    return saved.name.removesuffix(".parquet").rsplit(".", 1)[0]


def _saved(paths: tuple[Path, Path]) -> list[Path]:
    where = paths[0].parent / DIR
    return sorted(where.glob(f"{_stem(paths[0])}.r*.*.parquet")) if where.is_dir() else []


@dataclass
class Journal:
    """The journal of one job: the machine it runs on and that job's provenance, recorded with each repeat."""

    machine: str | None  # None where NVML failed part-way (provenance.this_machine)
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def save(self, paths: tuple[Path, Path], run: Mapping[str, Any], k: int, m: Measurement,
             provenance: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        """Keep repeat ``k`` (``m``) of the point ``paths`` with the settings ``run`` and the point's
        ``provenance`` (default: the job's)."""
        prov = self.provenance if provenance is None else provenance
        meta = {"settings_key": settings_key(run), "repeat": k, "wall_s": m.wall_s, "provenance": prov,
                "meta": m.meta}  # fmt: skip
        req_path, tel_path = partial_paths(paths, k)
        io.write_parquet(m.telemetry, tel_path, meta)
        io.write_parquet(m.requests, req_path, meta)  # last: a requests file means its telemetry is there

    def load(self, paths: tuple[Path, Path], run: Mapping[str, Any]) -> list[Measurement]:
        """The saved repeats of the point ``paths`` measured with the settings ``run``: ``r0``, ``r1``, ... up
        to the first one missing, unreadable or of other settings; every other saved file is set aside
        (:func:`set_aside`)."""
        key, runs = settings_key(run), []
        while True:
            req_path, tel_path = partial_paths(paths, len(runs))
            try:
                meta = io.read_meta(req_path)
                if meta.get("settings_key") != key:
                    log.warning("%s: measured with other settings, not resumed", req_path)
                    break
                req, tel = pl.read_parquet(req_path), pl.read_parquet(tel_path)
            except (OSError, ValueError, KeyError, pl.exceptions.PolarsError):
                break  # missing (the usual end) or cut short
            self._check_kind(req_path, meta.get("provenance") or {})
            rep = {**meta["meta"], "resumed": True, "provenance": meta.get("provenance")}
            runs.append(Measurement(requests=req, telemetry=tel, meta=rep, wall_s=float(meta["wall_s"])))
        kept = {p for k in range(len(runs)) for p in partial_paths(paths, k)}
        stale = sorted(set(_saved(paths)) - kept)
        for rep in dict.fromkeys(_repeat_of(f) for f in stale):  # a repeat's files move together
            set_aside([f for f in stale if _repeat_of(f) == rep])
        if runs:
            log.info("%s: %d repeats resumed from %s", paths[0].name, len(runs), paths[0].parent / DIR)
        return runs

    def _check_kind(self, path: Path, saved: Mapping[str, Any]) -> None:
        """Raise :class:`ResumeMismatch` if the saved repeat ``path`` ran on another GPU model or engine
        version than this job (:func:`slmserve.provenance.kind_differences`)."""
        said = kind_differences(saved, self.provenance)
        if said:
            raise ResumeMismatch(
                f"{path}: a saved repeat of this point was measured elsewhere ({said}); one point must not mix "
                f"them. Run the job where it was measured, or move {path.parent} away to measure the point "
                "afresh here"
            )


def set_aside(files: Sequence[Path]) -> list[Path]:
    """Move the saved files of one repeat (``files``: its requests and telemetry), which no job resumes, to
    ``.partial/set-aside/<settings hash>-[<n>-]<name>``, one ``n`` for all of them so that they still pair
    up, and return where; a file cut short (no metadata) holds no repeat and is deleted."""
    keys: dict[Path, str] = {}
    for f in files:
        try:
            keys[f] = io.read_meta(f).get("settings_key") or "unknown"
        except (OSError, ValueError, KeyError, pl.exceptions.PolarsError):
            f.unlink(missing_ok=True)
    if not keys:
        return []
    where = next(iter(keys)).parent / SET_ASIDE

    def dest(f: Path, n: int) -> Path:
        return where / f"{keys[f]}-{f'{n}-' if n else ''}{f.name}"

    n = 0
    while any(dest(f, n).exists() for f in keys):
        n += 1
    where.mkdir(exist_ok=True)
    for f in keys:
        f.replace(dest(f, n))
    log.warning("%s: not resumed (other settings, or after a missing repeat); set aside in %s",
                ", ".join(f.name for f in keys), where)  # fmt: skip
    return [dest(f, n) for f in keys]


def has_saved(paths: tuple[Path, Path], run: Mapping[str, Any]) -> bool:
    """Whether :meth:`Journal.load` would resume a repeat of the point ``paths`` measured with the settings
    ``run``: its ``r0`` is readable and of these settings (others it would set aside)."""
    try:
        return io.read_meta(partial_paths(paths, 0)[0]).get("settings_key") == settings_key(run)
    except (OSError, ValueError, KeyError, pl.exceptions.PolarsError):
        return False


def discard_saved(paths: tuple[Path, Path]) -> list[Path]:
    """Delete the saved repeats of the point ``paths``, and ``.partial/`` once empty: its result is written
    (measured, or recorded as infeasible or unsupported). Returns the files deleted."""
    saved = _saved(paths)
    for p in saved:
        p.unlink(missing_ok=True)
    # another job may be saving into it (a shared folder, e.g. replication/): a folder not empty stays
    with contextlib.suppress(FileNotFoundError, OSError):
        (paths[0].parent / DIR).rmdir()
    return saved
