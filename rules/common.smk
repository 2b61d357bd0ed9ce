# Helpers shared by all stages (config checks, run naming, target lists).

import math
from pathlib import Path

from slmserve.config import check, parse_rate, rate_label

check(config, Path(workflow.basedir))

OUT = config["outdir"]
FIG = config["figdir"]
PROFILE = config["profile"]
LOGS = f"logs/{PROFILE}"
WL = config["workload"]
SWEEP = config["experiments"]["sweep"]
RUN = f"{OUT}/runs/{{model}}/tp{{tp}}-out{{out}}-rate{{rate}}"
# The same with its wildcards escaped, for expand() over batch sizes in output: lists.
RUN_PATTERN = RUN.replace("{", "{{").replace("}", "}}")
# Wildcard values: a model key of the config (dots escaped), GPU count, output length, rate, batch.
MODEL_RE = "|".join(k.replace(".", r"\.") for k in config["models"])

def prompts_file():
    return f"{OUT}/data/prompts-in{WL['input_len']}-n{WL['num_requests']}.parquet"


def run_dir(model, tp, out=None, rate=None):
    out = WL["output_len"] if out is None else out
    rate = parse_rate(WL["arrival_rate"] if rate is None else rate)
    return RUN.format(model=model, tp=tp, out=out, rate=rate_label(rate))


def run_files(model, tp, batch_sizes, out=None, rate=None):
    """Requests parquet of each batch size of one sweep job."""
    return [f"{run_dir(model, tp, out, rate)}/bs{bs}.requests.parquet" for bs in batch_sizes]


def sweep_runs():
    return [
        f
        for model in SWEEP["models"]
        for tp in SWEEP["tensor_parallel"]
        for f in run_files(model, tp, SWEEP["batch_sizes"])
    ]


def sweep_job(wildcards):
    """Arguments of slmserve.runner.SweepJob for one sweep job."""
    entry = config["models"][wildcards.model]
    eng, tel = config["engine"], config["telemetry"]
    return {
        "model": wildcards.model,
        "model_path": entry.get("weights") or entry["config"],
        "load_format": "auto" if entry.get("weights") else "dummy",
        "tensor_parallel": int(wildcards.tp),
        "batch_sizes": SWEEP["batch_sizes"],
        "input_len": WL["input_len"],
        "output_len": int(wildcards.out),
        "num_requests": WL["num_requests"],
        "arrival_rate": parse_rate(wildcards.rate),
        "warmup_requests": WL["warmup_requests"],
        "seed": config["dataset"]["seed"],
        "telemetry_interval_s": tel["interval_ms"] / 1000,
        "telemetry_enabled": tel["enabled"],
        "profile": PROFILE,
        **{k: eng[k] for k in ("batch_control", "memory_share", "memory_budget_gb", "max_model_len",
                               "dtype", "startup_timeout_s", "cpu_kv_cache_gb", "stream_interval")},
    }


def all_targets():
    return [
        f"{OUT}/summary/sweep.parquet",
        *expand(f"{FIG}/throughput_latency.{{ext}}", ext=["png", "svg", "html"]),
    ]
