"""Replicas on one GPU (issue 15): started one after another or together, plain processes or under MPS.

    python bench/replicas.py run --model opt1.3b --probe results/capacity/opt1.3b-whole.json --prompts P
        --out DIR [--replicas 1 2 3] [--variants sequential together together-mps] [--repeats 3]
        [--plans 4x256 ...] [--advisor paper_figures/quick/advisor.csv [--max-replicas 4]]
    python bench/replicas.py compare DIR     # here, on the results brought back

``run`` measures each replica count in each variant with the workflow's own replication job
(:func:`slmserve.replication.run_replication`: the whole-GPU maximum batch from ``--probe`` split evenly,
the requests split evenly, repeats on the same servers). Variants: ``sequential`` and ``together``
(``experiments.replication.start``), with ``-mps`` under a job-private MPS daemon. One replica is measured once,
as ``sequential``: it is the one-instance reference. Results, as the workflow writes them:
``DIR/<model>/<variant>/r<n>.requests.parquet`` (and the telemetry beside it).

Plans other than the paper's equal split of the one-GPU maximum (issue 15, the plan experiment): ``--plans
KxB`` runs K replicas of batch B each (each with 1/K of the memory share) in every variant, into
``r<K>-b<B>.requests.parquet``; ``--advisor CSV`` adds the batching advisor's plan for the model
(:func:`advisor_plan`: its replicas that fit, at most ``--max-replicas``, times its chosen batch).

``compare`` prints and writes ``DIR/compare.csv``: per model, replicas and variant, the system throughput
(req/s, all replicas' requests over the common wall-clock window) with n and 95% CI; its ratio with its 95% CI
(:func:`slmserve.stats.ratio_ci`) to one instance (``gain``: the equal split's one replica, ``r1``) and to the
``sequential`` plain start of the same plan (``vs_sequential``); the plan (``equal`` or ``KxB``); each
replica's KV-cache tokens; and the start-up span (first launch to last server ready, from the servers' own
clocks).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench.batch_control import cli, shrunk, smoke_args, sweep_job, write_table
from slmserve import capacity, io, measure, replication, runner, stats

log = logging.getLogger("replicas")
VARIANTS = ("sequential", "together", "sequential-mps", "together-mps")


def parse_plan(text: str) -> tuple[int, int]:
    """``"4x256"`` -> (4 replicas, batch 256 each); ValueError naming the form otherwise."""
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ValueError(f"plan {text!r}: write it as REPLICASxBATCH, e.g. 4x256")
    return int(m[1]), int(m[2])


def advisor_plan(csv: Path, model: str, max_replicas: int) -> tuple[int, int]:
    """The batching advisor's plan for ``model`` from its table (``advisor.csv``), as the workflow's rule
    ``replication_plan`` takes it (:func:`slmserve.replication.advisor_plan`): (replicas, batch)."""
    plan = replication.advisor_plan(pl.read_csv(csv), model, max_replicas, str(csv))
    if plan.replicas is None or plan.batch is None:
        raise SystemExit(f"{csv}: {plan.why}; run the advisor on its sweep first")
    return plan.replicas, plan.batch


def plan_name(path: Path) -> str:
    """``r2.requests.parquet`` -> ``equal``; ``r4-b256.requests.parquet`` -> ``4x256``."""
    stem = path.name.removesuffix(".requests.parquet")
    n, _, batch = stem.removeprefix("r").partition("-b")
    return f"{n}x{batch}" if batch else "equal"


def run(args: argparse.Namespace) -> None:
    probe = capacity.read_probe(args.probe)
    base = sweep_job(args.model, "restart", args.prompts, args.out, [1], repeats=args.repeats, requests=args.requests)
    base = shrunk(base, args)
    one_gpu_max = runner.max_batch_from_probe(probe, base.fits)
    plans = [parse_plan(p) for p in args.plans]
    if args.advisor:
        plans.append(advisor_plan(args.advisor, args.model, args.max_replicas))
    todo = [(1, None, "sequential")] if 1 in args.replicas else []
    todo += [(n, None, v) for n in args.replicas if n > 1 for v in args.variants]
    todo += [(n, b, v) for n, b in dict.fromkeys(plans) for v in args.variants]
    for n, batch, variant in todo:
        name = f"r{n}" if batch is None else f"r{n}-b{batch}"
        out = args.out / args.model / variant / f"{name}.requests.parquet"
        if out.exists():
            log.info("%s: already measured", out)
            continue
        start, _, mps = variant.partition("-")
        replication.run_replication(base, n, one_gpu_max, out, probe=probe, start=start, use_mps=bool(mps),
                                    batch=batch)  # fmt: skip
        log.info("== %s %s %s: done", args.model, name, variant)


def startup_span_s(servers: list[dict[str, Any]]) -> float | None:
    """First launch to last server ready: ``max(launched_at + startup_s) - min(launched_at)`` (seconds, on
    the job's monotonic clock), or None where a server lacks either."""
    if not servers or any(s.get("launched_at") is None or s.get("startup_s") is None for s in servers):
        return None
    return max(s["launched_at"] + s["startup_s"] for s in servers) - min(s["launched_at"] for s in servers)


def compare(args: argparse.Namespace) -> pl.DataFrame:
    paths = sorted(args.out.glob("*/*/r*.requests.parquet"))
    if not paths:
        raise SystemExit(f"{args.out}: no */<variant>/r*.requests.parquet here; run `run` first")
    rows, servers, out = [], {}, []
    for p in paths:
        meta, variant, plan = io.read_meta(p), p.parent.name, plan_name(p)
        run = meta["run"]
        if meta["status"] != "ok":  # e.g. MPS on the CPU engine: unsupported, with the reason
            out.append({"model": run["model"], "replicas": run["replicas"], "batch_per_replica": run.get(
                "batch_per_replica"), "plan": plan, "variant": variant, "status": meta["status"],
                "reason": meta.get("reason")})  # fmt: skip
            continue
        rows += [{**r, "variant": variant, "plan": plan} for r in replication.summarize_repeats(p)]
        servers[(run["model"], variant, run["replicas"], plan)] = measure.repeats_of(meta)[0]["servers"]
    frame = pl.DataFrame(rows, infer_schema_length=None)
    keys = ("model", "replicas", "plan", "variant")
    for (model, n, plan, variant), g in frame.group_by(*keys, maintain_order=True):
        tput = g["throughput_rps"].to_list()
        mine = frame.filter(pl.col("model") == model, pl.col("replicas") == n, pl.col("plan") == plan)
        one = frame.filter(pl.col("model") == model, pl.col("replicas") == 1, pl.col("plan") == "equal",
                           pl.col("variant") == "sequential")["throughput_rps"].to_list()  # fmt: skip
        seq = mine.filter(pl.col("variant") == "sequential")["throughput_rps"].to_list()
        d, gain, vs_seq = stats.describe(tput), stats.ratio_ci(tput, one), stats.ratio_ci(tput, seq)
        srv = servers[(model, variant, n, plan)]
        out.append({
            "model": model, "replicas": n, "batch_per_replica": g["batch_per_replica"][0], "plan": plan,
            "variant": variant, "status": "ok", "reason": None, "n": d["n"],
            "throughput_rps": d["mean"], "ci_lo": d["ci_lo"], "ci_hi": d["ci_hi"],
            "gain": gain["ratio"], "gain_ci_lo": gain["ci_lo"], "gain_ci_hi": gain["ci_hi"],
            "vs_sequential": vs_seq["ratio"], "vs_sequential_ci_lo": vs_seq["ci_lo"],
            "vs_sequential_ci_hi": vs_seq["ci_hi"], "kv_tokens": str([s.get("kv_cache_tokens") for s in srv]),
            "startup_span_s": startup_span_s(srv),
        })  # fmt: skip
    table = pl.DataFrame(out, infer_schema_length=None).sort("model", "replicas", "plan", "variant")
    return write_table(table, args.out, precision=3)


def run_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--probe", type=Path, required=True, help="the model's whole-GPU KV-cache probe (JSON)")
    r.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    r.add_argument("--variants", nargs="+", default=["sequential", "together", "together-mps"], choices=VARIANTS)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--requests", type=int, default=500, help="requests per run, split over the replicas")
    r.add_argument("--plans", nargs="*", default=[], help="more plans, REPLICASxBATCH each (e.g. 4x256)")
    r.add_argument("--advisor", type=Path, help="the batching advisor's table (advisor.csv): add its plan")
    r.add_argument("--max-replicas", type=int, default=4, help="most replicas of the advisor's plan")
    smoke_args(r)


def main(argv: list[str] | None = None) -> int:
    return cli(__doc__, run_args, run, compare, argv)


if __name__ == "__main__":
    raise SystemExit(main())
