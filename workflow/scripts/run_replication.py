"""Snakemake entry point of rule `replication`: n replicas of one model on one GPU."""

import json
from pathlib import Path

from common import log_to_file, sweep_job

from slmserve.replication import run_replication
from slmserve.runner import max_batch_from_probe

log_to_file(snakemake)
probe_path = snakemake.input.capacity
probe = json.loads(Path(probe_path).read_text())
one_gpu_max = max_batch_from_probe(probe, snakemake.params.job["fits"], probe_path)
settings = snakemake.config["experiments"]["replication"]
run_replication(sweep_job(snakemake), int(snakemake.wildcards.n), one_gpu_max, Path(snakemake.output.requests),
                probe=probe, start=settings["start"], use_mps=settings["mps"])  # fmt: skip
