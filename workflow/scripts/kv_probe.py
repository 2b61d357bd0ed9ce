"""Snakemake entry point of rule `kv_probe`: vLLM's KV-cache capacity for one model and budget."""

import logging
from pathlib import Path

from slmserve.runner import SweepJob, probe_capacity

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
log_dir = Path(snakemake.log[0]).with_suffix("")
job = SweepJob(**snakemake.params.job, prompts_path=Path("-"), outputs={}, log_dir=log_dir)
result = probe_capacity(job, snakemake.params.budget, Path(snakemake.output[0]))
logging.info("KV cache %s tokens; max batch %s (admission)", result["kv_cache_tokens"], result["max_batch_admission"])
