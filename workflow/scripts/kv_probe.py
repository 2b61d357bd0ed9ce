"""Snakemake entry point of rule `kv_probe`: vLLM's KV-cache capacity for one model and budget."""

import logging
from pathlib import Path

from common import log_to_file, sweep_job

from slmserve.runner import probe_capacity

log_to_file(snakemake)
job = sweep_job(snakemake, prompts="-")  # a probe sends no prompt
result = probe_capacity(job, snakemake.params.budget, Path(snakemake.output[0]))
logging.info("KV cache %s tokens; max batch %s (admission)", result["kv_cache_tokens"], result["max_batch_admission"])
