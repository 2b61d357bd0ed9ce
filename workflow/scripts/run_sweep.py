"""Snakemake entry point of rule `sweep`: one model, tp GPUs, every batch size (slmserve.runner)."""

import logging
from pathlib import Path

from common import log_to_file, sweep_job

from slmserve.runner import run_sweep

log_to_file(snakemake)
outputs = {
    bs: (Path(req), Path(tel))
    for bs, req, tel in zip(
        snakemake.params.job["batch_sizes"], snakemake.output.requests, snakemake.output.telemetry, strict=True
    )
}
try:
    run_sweep(sweep_job(snakemake, outputs))
except BaseException:
    logging.exception("sweep failed")
    raise
