"""Snakemake entry point of rules `replication` (n replicas of one model on one GPU, the paper's equal split)
and `replication_plan` (the batching advisor's plan from the model's one-GPU sweep, plain or under MPS)."""

from pathlib import Path

from common import log_to_file, sweep_job

from slmserve import advisor, capacity
from slmserve.replication import advisor_plan, run_advisor_plan, run_replication
from slmserve.runner import max_batch_from_probe

log_to_file(snakemake)
inp, params, wildcards = snakemake.input, snakemake.params, snakemake.wildcards
probe = capacity.read_probe(inp.capacity)
one_gpu_max = max_batch_from_probe(probe, params.job["fits"])
settings = snakemake.config["experiments"]["replication"]
out = Path(snakemake.output.requests)
if snakemake.rule == "replication_plan":
    table = advisor.advise_model(wildcards.model, list(inp.sweep), params.models, [inp.capacity], list(inp.budget),
                                 advisor.Settings(**params.advisor))  # fmt: skip
    plan = advisor_plan(table, wildcards.model, settings["advisor_plan"]["max_replicas"], "the advisor of its sweep")
    run_advisor_plan(sweep_job(snakemake), plan, one_gpu_max, out, probe=probe, start=settings["start"],
                     use_mps=wildcards.variant == "mps", advice=table.row(0, named=True))  # fmt: skip
else:
    run_replication(sweep_job(snakemake), int(wildcards.n), one_gpu_max, out, probe=probe, start=settings["start"],
                    use_mps=settings["mps"])  # fmt: skip
