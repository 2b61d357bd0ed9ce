"""Snakemake entry point of rules `sweep` (one model, tp GPUs, every batch size) and `calibration` (one batch)."""

import logging
from pathlib import Path

from common import log_to_file, sweep_job

from slmserve.runner import run_sweep

log_to_file(snakemake)


def _files(value):
    return [value] if isinstance(value, str) else list(value)  # one batch (rule calibration): one file


outputs = {
    bs: (Path(req), Path(tel))
    for bs, req, tel in zip(
        snakemake.params.job["batch_sizes"],
        _files(snakemake.output.requests),
        _files(snakemake.output.telemetry),
        strict=True,
    )
}
try:
    run_sweep(sweep_job(snakemake, outputs))
except BaseException:
    logging.exception("sweep failed")
    raise
