"""Snakemake entry point of rule `output_lengths`: one model, every (output length, rate) on one server."""

import json
import logging
from pathlib import Path

from slmserve.runner import SweepJob, max_batch_from_probe, run_points

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
params = dict(snakemake.params.job)
batch = max_batch_from_probe(
    json.loads(Path(snakemake.input.capacity).read_text()), params["fits"], snakemake.input.capacity
)
points = {
    (out, rate): (Path(req), Path(tel))
    for (out, rate), req, tel in zip(
        snakemake.params.points, snakemake.output.requests, snakemake.output.telemetry, strict=True
    )
}
job = SweepJob(**{**params, "batch_sizes": [batch]}, prompts_path=Path(snakemake.params.prompts), outputs={},
               log_dir=Path(snakemake.log[0]).with_suffix(""))  # fmt: skip
logging.info("batch %d (one-GPU maximum) for %d points", batch, len(points))
run_points(job, max(batch, 1), points)
