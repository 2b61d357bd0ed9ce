"""What a device call brought back (`gpu_dag.sh`'s ``results.tgz``), merged into the checkout.

The steps bench/GPU_SESSION.md asks after every call, in one place (by hand they once left a telemetry file
behind, and the summary failed): every file of the archive's outdirs goes into the tree, a point measured again
replacing the committed one, except a job's run markers (``.<file>.measuring``) and temporary files. Saved
repeats of an unfinished job (``.partial/``, :mod:`slmserve.journal`) come too, untracked, so that the next
machine resumes them; those of a point whose result came back are deleted
(:func:`slmserve.journal.discard_saved`), as the job deleted them on the device. The archive's Snakemake log and
its job logs, without the servers' logs (they stay out of git), go to a folder of ``bench/results/``. The
paths the call named in ``FRESH`` (measured again) are removed from the tree first, as gpu_dag.sh removed them on
the device: else a sweep cut short there would look done here, its old result still in place.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from slmserve import journal
from slmserve.io import atomic_write_bytes, atomic_write_text

SNAKEMAKE_LOG = "snakemake.log"
NOT_RESULTS = (SNAKEMAKE_LOG, ".started")  # the archive's own files beside the outdirs and logs/
MARKER_SUFFIXES = (".measuring", ".tmp")  # a job's "running" marker, a write in progress


@dataclass
class Imported:
    """What :func:`import_archive` did: tree paths relative to the checkout, and the log files it wrote."""

    results: list[str] = field(default_factory=list)  # measured files copied into the tree
    saved: list[str] = field(default_factory=list)  # saved repeats copied, for the next machine
    discarded: list[str] = field(default_factory=list)  # points whose saved repeats went: their result came
    logs: list[str] = field(default_factory=list)  # the files written in the logs folder


def is_server_log(rel: str) -> bool:
    """Whether a log (path relative to the archive) is a server's or MPS control's, which stay out of git."""
    name = rel.rsplit("/", 1)[-1]
    return "/server" in rel or name.startswith("server") or name == "control.log"


def job_logs(root: Path) -> str:
    """The job logs under ``root/logs`` (not :func:`is_server_log`'s), each after a ``== logs/...`` line."""
    rels = sorted(p.relative_to(root).as_posix() for p in (root / "logs").rglob("*.log") if p.is_file())
    return "".join(f"== {rel}\n{(root / rel).read_text()}" for rel in rels if not is_server_log(rel))


def import_archive(archive: Path, repo: Path, logs_dir: Path, fresh: Sequence[str] = ()) -> Imported:
    """Merge ``archive`` into the checkout ``repo`` and write its logs to ``logs_dir``, after removing the
    ``fresh`` paths (relative to ``repo``) from it (module docstring).

    ValueError, before anything is written, for an archive without ``snakemake.log`` (not gpu_dag.sh's), a
    ``logs_dir`` that exists (another machine's logs) or a ``fresh`` path that is not inside the checkout."""
    if logs_dir.exists():
        raise ValueError(f"{logs_dir} exists: name this machine's logs folder anew (e.g. the next mNN)")
    for rel in fresh:
        if PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts or not rel.strip("/."):
            raise ValueError(f"fresh path {rel!r}: give a path inside the checkout, as FRESH gave it to gpu_dag.sh")
    done = Imported()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")  # refuses absolute paths and links out of the folder
        if not (root / SNAKEMAKE_LOG).is_file():
            raise ValueError(f"{archive}: no {SNAKEMAKE_LOG} in it; is it gpu_dag.sh's results.tgz?")
        for rel in fresh:
            gone = repo / rel
            shutil.rmtree(gone) if gone.is_dir() else gone.unlink(missing_ok=True)
        files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        results = [f for f in files if f not in NOT_RESULTS and not f.startswith("logs/")
                   and not f.endswith(MARKER_SUFFIXES)]  # fmt: skip
        for rel in results:
            atomic_write_bytes(repo / rel, (root / rel).read_bytes())  # a copy cut short never looks like a result
            if journal.DIR in rel.split("/"):
                done.saved.append(rel)
                continue
            done.results.append(rel)
            point = repo / rel
            if not rel.endswith(".telemetry.parquet") and journal.discard_saved((point, point)):
                done.discarded.append(rel)
        logs_dir.mkdir(parents=True)
        atomic_write_bytes(logs_dir / SNAKEMAKE_LOG, (root / SNAKEMAKE_LOG).read_bytes())
        atomic_write_text(logs_dir / "jobs.log", job_logs(root) if (root / "logs").is_dir() else "")
        done.logs = [str(logs_dir / SNAKEMAKE_LOG), str(logs_dir / "jobs.log")]
    return done
