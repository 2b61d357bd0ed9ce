"""GPU measurement for issue 3: batch control (client vs server) and telemetry overhead.

Runs on the GPU host with the real vLLM (not through Snakemake, which the offline host lacks):

    python bench/gpu_batch_control.py --model opt125m --prompts PROMPTS --out $OUT [--server-batches 8 64 512]

1. ``client`` mode: one server (--max-num-seqs 512), batch sizes 1..512 held by the client.
2. ``server`` mode: one server start per batch size (--max-num-seqs = batch), the paper's method, at the
   batch sizes given.
3. Telemetry overhead: one server, batch 64, runs alternating sampler on (100 ms) and off.

Small batches get fewer requests (8 rounds of the batch, at least 64, at most 500), the same in both modes.
Every run is a regular result pair (requests + telemetry parquet) with provenance; a summary CSV is printed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from slmserve import analysis, runner
from slmserve.gpuslots import GpuSlots
from slmserve.server import VllmServer

MODELS = {
    "opt125m": "config/models/opt-125m",
    "opt1.3b": "config/models/opt-1.3b",
    "opt2.7b": "config/models/opt-2.7b",
}
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def job(model: str, prompts: Path, out: Path, mode: str, batches: list[int], tag: str) -> runner.SweepJob:
    base = out / "runs" / model / tag
    return runner.SweepJob(
        model=model,
        model_path=MODELS[model],
        load_format="dummy",
        tensor_parallel=1,
        batch_sizes=batches,
        prompts_path=prompts,
        outputs={b: (base / f"bs{b}.requests.parquet", base / f"bs{b}.telemetry.parquet") for b in batches},
        log_dir=out / "logs" / model / tag,
        input_len=512,
        output_len=256,
        num_requests=500,
        rounds_per_batch=8,
        min_requests=64,
        warmup_requests=8,
        batch_control=mode,
        memory_share=0.9,
        max_model_len=1024,
        dtype="float16",
        profile="gpu-bench",
    )


def telemetry_overhead(model: str, prompts: Path, out: Path, repeats: int) -> pl.DataFrame:
    """Alternate sampler on/off on one server at batch 64 (256 requests)."""
    batch = 64
    j = job(model, prompts, out, "client", [batch], "overhead")
    j.num_requests = 256
    j.rounds_per_batch = None
    pr = pl.read_parquet(prompts).head(j.num_requests)
    rows = []
    with (
        GpuSlots(1, label="overhead") as alloc,
        VllmServer(runner._server_spec(j, alloc, batch, "overhead")) as srv,
    ):
        for i in range(repeats):
            for enabled in (True, False):
                j.telemetry_enabled = enabled
                tag = f"overhead/{'on' if enabled else 'off'}{i}"
                req = out / "runs" / model / f"{tag}.requests.parquet"
                j.outputs = {batch: (req, out / "runs" / model / f"{tag}.telemetry.parquet")}
                runner.measure(j, srv, batch, alloc, pr)
                row = analysis.summarize_run(req)
                rows.append(
                    {
                        "repeat": i,
                        "telemetry": enabled,
                        "throughput_rps": row["throughput_rps"],
                        "output_tok_s": row["output_tok_s"],
                        "latency_mean_s": row["latency_mean_s"],
                    }
                )
    return pl.DataFrame(rows)


def client_fidelity(model: str, prompts: Path, out: Path, batches: list[int]) -> pl.DataFrame:
    """Is the streaming client a bottleneck? Same server: streaming vs non-streaming requests; then a
    server with --stream-interval 16 (one chunk per 16 tokens)."""
    rows = []
    pr = pl.read_parquet(prompts)
    for interval, variants in ((None, (True, False)), (16, (True,))):
        tag = f"fidelity-si{interval or 1}"
        j = job(model, prompts, out, "client", batches, tag)
        j.stream_interval = interval
        with (
            GpuSlots(1, label=tag) as alloc,
            VllmServer(runner._server_spec(j, alloc, max(batches), tag)) as srv,
        ):
            for batch in batches:
                for stream in variants:
                    j.stream = stream
                    name = f"{tag}/bs{batch}-{'stream' if stream else 'nostream'}"
                    req = out / "runs" / model / f"{name}.requests.parquet"
                    j.outputs = {batch: (req, out / "runs" / model / f"{name}.telemetry.parquet")}
                    runner.measure(j, srv, batch, alloc, pr)
                    row = analysis.summarize_run(req)
                    rows.append(
                        {
                            "stream_interval": interval or 1,
                            "stream": stream,
                            "batch_size": batch,
                            "throughput_rps": row["throughput_rps"],
                            "output_tok_s": row["output_tok_s"],
                            "latency_mean_s": row["latency_mean_s"],
                            "client_cpu_frac": row["client_cpu_frac"],
                        }
                    )
    return pl.DataFrame(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--server-batches", type=int, nargs="*", default=[8, 64, 512])
    ap.add_argument("--client-batches", type=int, nargs="*", default=BATCHES)
    ap.add_argument("--overhead-repeats", type=int, default=0)
    ap.add_argument("--fidelity-batches", type=int, nargs="*", default=[])
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pl.Config.set_tbl_rows(50)
    pl.Config.set_tbl_cols(20)
    pl.Config.set_tbl_width_chars(200)
    t0 = time.monotonic()
    timings = {}
    for mode, batches in (("client", args.client_batches), ("server", args.server_batches)):
        if not batches:
            continue
        t = time.monotonic()
        runner.run_sweep(job(args.model, args.prompts, args.out, mode, batches, mode))
        timings[mode] = time.monotonic() - t
        print(f"== {args.model} {mode}: {timings[mode]:.1f} s for batches {batches}", flush=True)
    paths = sorted(
        p for mode in ("client", "server") for p in (args.out / "runs" / args.model / mode).glob("bs*.requests.parquet")
    )
    summary = analysis.summarize_runs(paths)
    summary = summary.with_columns(mode=pl.col("path").str.extract(r"/(client|server)/"))
    summary.write_csv(args.out / f"summary-{args.model}.csv")
    cols = [
        "mode",
        "batch_size",
        "status",
        "n_ok",
        "throughput_rps",
        "output_tok_s",
        "latency_mean_s",
        "ttft_mean_s",
        "tpot_mean_s",
        "sm_active_mean",
        "sm_occupancy_mean",
        "dram_bw_mean",
        "power_w_mean",
        "energy_per_token_j",
        "peak_inflight",
        "client_cpu_frac",
        "client_ok",
        "kv_cache_tokens",
    ]
    print(summary.select([c for c in cols if c in summary.columns]).sort("mode", "batch_size"))
    both = summary.filter(pl.col("status") == "ok").pivot(
        on="mode", index="batch_size", values="throughput_rps", aggregate_function="first"
    )
    if {"client", "server"} <= set(both.columns):
        both = both.drop_nulls().with_columns(ratio=pl.col("client") / pl.col("server"))
        print("throughput client/server:\n", both)
        both.write_csv(args.out / f"batch-control-{args.model}.csv")
    if args.overhead_repeats:
        oh = telemetry_overhead(args.model, args.prompts, args.out, args.overhead_repeats)
        oh.write_csv(args.out / f"telemetry-overhead-{args.model}.csv")
        agg = oh.group_by("telemetry").agg(pl.col("throughput_rps").mean(), pl.col("throughput_rps").std().alias("sd"))
        print("telemetry overhead:\n", oh, "\n", agg)
    if args.fidelity_batches:
        fid = client_fidelity(args.model, args.prompts, args.out, args.fidelity_batches)
        fid.write_csv(args.out / f"client-fidelity-{args.model}.csv")
        print("client fidelity:\n", fid)
    print(f"timings: {timings}, total {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
