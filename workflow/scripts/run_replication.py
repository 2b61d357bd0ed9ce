"""Snakemake entry point of rule `replication`: n replicas of one model on one GPU."""

import json
import logging
from pathlib import Path

from slmserve.replication import run_replication
from slmserve.runner import SweepJob, max_batch_from_probe

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
params = dict(snakemake.params.job)
one_gpu_max = max_batch_from_probe(
    json.loads(Path(snakemake.input.capacity).read_text()), params["fits"], snakemake.input.capacity
)
job = SweepJob(**params, prompts_path=Path(snakemake.params.prompts), outputs={},
               log_dir=Path(snakemake.log[0]).with_suffix(""))  # fmt: skip
run_replication(job, int(snakemake.wildcards.n), one_gpu_max, Path(snakemake.output.requests))
