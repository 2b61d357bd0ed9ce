"""Snakemake entry point of rule `sweep`: one model, tp GPUs, every batch size (slmserve.runner)."""

import logging
from pathlib import Path

from slmserve.runner import SweepJob, run_sweep

logging.basicConfig(
    filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
)
params = dict(snakemake.params.job)
batches = params["batch_sizes"]
outputs = {
    bs: (Path(req), Path(tel))
    for bs, req, tel in zip(batches, snakemake.output.requests, snakemake.output.telemetry, strict=True)
}
log_dir = Path(snakemake.log[0]).with_suffix("")
try:
    run_sweep(SweepJob(**params, prompts_path=Path(snakemake.params.prompts), outputs=outputs, log_dir=log_dir))
except BaseException:
    logging.exception("sweep failed")
    raise
