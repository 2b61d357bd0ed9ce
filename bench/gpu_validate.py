"""GPU check of the DAG's measuring code paths with the default settings, outside Snakemake (the offline
GPU host has no Snakemake):

    python bench/gpu_validate.py --prompts PROMPTS --out $OUT

1. KV-cache probes of OPT-125m and OPT-1.3B: 36 GB emulated and the whole GPU (Table 1 columns).
2. OPT-125m sweep with the defaults (server batch control, stream interval 16) at batch 8, 64 and 512.
3. OPT-125m replicated 2x on one GPU (batch per replica = one-GPU maximum / 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from slmserve import analysis, replication, runner

MODELS = {m: f"config/models/{m[:3]}-{m[3:]}" for m in ("opt125m", "opt1.3b", "opt2.7b", "opt6.7b", "opt13b")}


def job(model: str, prompts: Path, out: Path, batches: list[int], tag: str) -> runner.SweepJob:
    base = out / "runs" / model / tag
    return runner.SweepJob(
        model=model, model_path=MODELS[model], load_format="dummy", tensor_parallel=1, batch_sizes=batches,
        prompts_path=prompts, log_dir=out / "logs" / model / tag, input_len=512, output_len=256, num_requests=500,
        outputs={b: (base / f"bs{b}.requests.parquet", base / f"bs{b}.telemetry.parquet") for b in batches},
        rounds_per_batch=8, min_requests=64, warmup_requests=8, batch_control="server", stream_interval=16,
        memory_share=0.9, max_model_len=1024, dtype="float16", profile="gpu-validate",
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--probes-only", nargs="*", default=None, help="only the capacity probes of these models")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pl.Config.set_tbl_cols(20)
    pl.Config.set_tbl_width_chars(220)
    t = {}
    t0 = time.monotonic()
    probes = {}

    def probe(model: str) -> None:
        for budget in (36.0, None):
            j = job(model, args.prompts, args.out, [1], "probe")
            name = f"{model}-{'whole' if budget is None else '36gb'}"
            probes[name] = runner.probe_capacity(j, budget, args.out / "capacity" / f"{name}.json")
            keys = ("kv_cache_tokens", "block_size", "gpu_memory_utilization", "max_batch_admission",
                    "max_batch_no_preemption", "status", "reason")  # fmt: skip
            print(name, json.dumps({k: probes[name][k] for k in keys}), flush=True)

    if args.probes_only:
        for model in args.probes_only:
            probe(model)
        print("timings", round(time.monotonic() - t0, 1))
        return 0
    probe("opt125m")
    t["probes"] = time.monotonic() - t0

    t1 = time.monotonic()
    runner.run_sweep(job("opt125m", args.prompts, args.out, [8, 64, 512], "sweep"))
    t["sweep"] = time.monotonic() - t1
    paths = sorted((args.out / "runs/opt125m/sweep").glob("bs*.requests.parquet"))
    s = analysis.summarize_runs(paths)
    s.write_csv(args.out / "sweep-opt125m.csv")
    print(s.select("batch_size", "status", "n_ok", "throughput_rps", "output_tok_s", "latency_mean_s", "ttft_mean_s",
                   "sm_active_mean", "sm_occupancy_max", "dram_bw_mean", "power_w_mean", "energy_per_token_j",
                   "preemptions", "client_cpu_frac", "client_ok"))  # fmt: skip

    t2 = time.monotonic()
    one_gpu_max = probes["opt125m-whole"]["max_batch_admission"]
    rep_out = args.out / "replication" / "opt125m_r2.parquet"
    replication.run_replication(job("opt125m", args.prompts, args.out, [1], "replication"), 2, one_gpu_max, rep_out)
    t["replication"] = time.monotonic() - t2
    r = replication.summarize_runs([rep_out])
    r.drop("latency_mean_per_replica").write_csv(args.out / "replication-opt125m.csv")
    print(r.select("model", "replicas", "batch_per_replica", "status", "n_ok", "throughput_rps", "latency_mean_s",
                   "gpu_util_mean", "power_w_mean", "sm_active_mean", "preemptions"))  # fmt: skip
    t3 = time.monotonic()
    probe("opt1.3b")
    t["probes-1.3b"] = time.monotonic() - t3
    print("timings", {k: round(v, 1) for k, v in t.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
