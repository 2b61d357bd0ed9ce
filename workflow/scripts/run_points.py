"""Snakemake entry point of rule `output_lengths`: one model, every (output length, rate) on one server."""

import logging
from pathlib import Path

from common import log_to_file, sweep_job

from slmserve.capacity import read_probe
from slmserve.runner import max_batch_from_probe, run_points

log_to_file(snakemake)
probe = read_probe(snakemake.input.capacity)
batch = max_batch_from_probe(probe, snakemake.params.job["fits"])
points = {
    (out, rate): (Path(req), Path(tel))
    for (out, rate), req, tel in zip(
        snakemake.params.points, snakemake.output.requests, snakemake.output.telemetry, strict=True
    )
}
job = sweep_job(snakemake, batch_sizes=[batch])
logging.info("batch %d (one-GPU maximum) for %d points", batch, len(points))
run_points(job, max(batch, 1), points, probe)
