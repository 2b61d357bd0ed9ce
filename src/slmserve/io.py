"""Atomic parquet files that carry their provenance as schema metadata."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

META_KEY = b"slmserve"
T = TypeVar("T")
# mkstemp makes a file only its owner reads: results take the mode a plain write would (shared clusters)
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _temp_beside(target: Path) -> tuple[int, str]:
    """A temporary file in ``target``'s folder, made if missing: another job that empties a shared folder
    may remove it between the two steps (slmserve.journal.discard_saved), so that is tried again."""

    def make() -> tuple[int, str]:
        target.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".tmp-{target.name}.", dir=target.parent)

    try:
        return make()
    except FileNotFoundError:
        return make()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader never sees a partial file."""
    target = Path(path)
    fd, tmp = _temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            _publish(fh, tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _publish(fh: Any, tmp: str, target: Path) -> None:
    """Flush and sync the temporary file, give it a plain file's mode and rename it to ``target``."""
    fh.flush()
    os.fsync(fh.fileno())
    os.chmod(tmp, 0o666 & ~_UMASK)
    os.replace(tmp, target)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_parquet(df: pl.DataFrame, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> None:
    """Write ``df`` atomically (temporary file in the same folder, then rename) with ``meta`` as
    JSON under the schema metadata key ``slmserve``."""
    target = Path(path)
    table = df.to_arrow()
    merged = dict(table.schema.metadata or {})
    merged[META_KEY] = json.dumps(meta, sort_keys=True, default=str).encode()
    table = table.replace_schema_metadata(merged)
    fd, tmp = _temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            pq.write_table(table, fh, compression="zstd")
            _publish(fh, tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``slmserve`` metadata of a parquet file written by :func:`write_parquet`."""
    schema = _read(path, pq.read_schema)
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise ValueError(f"{path}: no slmserve metadata; was it written by this workflow?")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: its slmserve metadata is not JSON ({exc}); delete it and rerun its rule") from None


def read_table(path: str | os.PathLike[str]) -> pl.DataFrame:
    """The rows of a parquet file written by :func:`write_parquet`."""
    return _read(path, pl.read_parquet)


def _read(path: str | os.PathLike[str], reader: Callable[[Any], T]) -> T:
    """``reader(path)``; a missing or damaged file raises an error naming it and what to do."""
    try:
        return reader(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file; rerun the rule that writes it") from None
    except (pa.ArrowInvalid, pl.exceptions.ComputeError) as exc:
        raise ValueError(
            f"{path}: not a readable parquet file ({exc}); it is damaged or was cut short: delete it and rerun "
            "the rule that writes it"
        ) from None
    except OSError as exc:  # permissions, a folder, a network filesystem: the file itself may be fine
        raise OSError(exc.errno, f"{path}: cannot be read ({exc}); check its permissions and filesystem") from None
