"""Snakemake entry point of rule `replication`: n replicas of one model on one GPU."""

import json
from pathlib import Path

from common import log_to_file, sweep_job

from slmserve.replication import run_replication
from slmserve.runner import max_batch_from_probe

log_to_file(snakemake)
probe = snakemake.input.capacity
one_gpu_max = max_batch_from_probe(json.loads(Path(probe).read_text()), snakemake.params.job["fits"], probe)
run_replication(sweep_job(snakemake), int(snakemake.wildcards.n), one_gpu_max, Path(snakemake.output.requests))
