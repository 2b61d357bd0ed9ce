"""Batch control on a GPU: the scheduler cap (one start) against restarts with ``--max-num-seqs b``.

    python bench/batch_control.py run --model opt125m --prompts P --out DIR [--modes scheduler restart]
        [--batches 1 8 64 256 512] [--repeats 3]
    python bench/batch_control.py compare DIR      # here, on the results brought back

``run`` measures each mode with the workflow's own code (:func:`slmserve.runner.run_sweep`): ``scheduler``
starts one server (``--max-num-seqs`` = the largest batch) and repeats the batch sizes interleaved;
``restart`` starts one server per batch size and repeats each on it. 500 requests per point
(``--requests``), except small batches: 64 rounds of the batch (``--rounds``; a 500-request run at batch 1
takes minutes; stated in the output). Results:
``DIR/<model>/<mode>/bs<b>.{requests,telemetry}.parquet`` with provenance, as the workflow writes them.

``compare`` prints, per model, restart variant (``restart``, or ``restart-graphs<N>`` measured with
``--graphs N`` = ``--max-cudagraph-capture-size`` on every server) and batch, each mode's mean throughput
(req/s) with n and its 95% CI, and the ratio scheduler/restart with its 95% CI
(:func:`slmserve.stats.ratio_ci`), and the verdict of that CI at 3% (:func:`slmserve.stats.verdict`: the
modes agree where it contains 1 and its half-width is at most 3%, differ where it excludes 1, and the
repeats cannot tell otherwise). It writes ``DIR/compare.csv``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from slmserve import analysis, runner, stats
from slmserve.gpuslots import GpuSlots
from slmserve.measure import header, write_point
from slmserve.server import VllmServer

log = logging.getLogger("bench")

AGREEMENT = 0.03  # issue 13: the modes agree when the ratio's CI contains 1 within +-3%
MODELS = {"opt125m": "config/models/opt-125m", "opt1.3b": "config/models/opt-1.3b", "opt2.7b": "config/models/opt-2.7b"}


def sweep_job(model: str, mode: str, prompts: Path, out: Path, batches: list[int], repeats: int,
              graphs: int | None = None, requests: int = 500, rounds: int = 64) -> runner.SweepJob:  # fmt: skip
    return runner.SweepJob(
        model=model, model_path=MODELS[model], load_format="dummy", tensor_parallel=1, batch_sizes=batches,
        prompts_path=prompts,
        outputs=setting_outputs(out, model, mode if graphs is None else f"{mode}-graphs{graphs}", batches),
        log_dir=out / "logs" / model / mode, input_len=512, output_len=256, num_requests=requests,
        rounds_per_batch=rounds, min_requests=rounds, warmup_requests=8, batch_control=mode, repeats=repeats,
        stream_interval=16, profile="bench-batch-control", max_cudagraph_capture_size=graphs,
    )  # fmt: skip


def run(args: argparse.Namespace) -> None:
    for mode in args.modes:
        job = sweep_job(args.model, mode, args.prompts, args.out, args.batches, args.repeats, args.graphs,
                        args.requests, args.rounds)  # fmt: skip
        if all(paths[0].exists() for paths in job.outputs.values()):
            print(f"== {args.model} {mode}: already measured", flush=True)
            continue
        runner.run_sweep(job)
        print(f"== {args.model} {mode}: done", flush=True)


# How :func:`alternate` logs each measured run; :func:`log_samples` reads it back.
RUN_LINE = "repeat %d batch %d %s: %d requests in %.2f s"
_RUN_RE = re.compile(r"repeat (\d+) batch (\d+) (\S+): (\d+) requests in ([\d.]+) s")
_LABEL_RE = re.compile(r"'(\S+) [^']*' holds GPU")


def order(settings: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """Which setting goes first in a repeat: the first one in even repeats, the last one in odd ones."""
    return settings if repeat % 2 == 0 else settings[::-1]


def alternate(by: dict[str, runner.SweepJob], batches: list[int], repeats: int, label: str,
              before: Callable[[str, VllmServer], Any] | None = None) -> None:  # fmt: skip
    """Measure two or more settings (``by``: name -> job, the first job's server for all) on one server
    (``--max-num-seqs`` = the largest batch, batch capped in the scheduler): each repeat runs every batch in
    every setting, the settings alternating which goes first (:func:`order`) so that drift falls on all;
    ``before(setting, server)`` runs before each measured run. Writes each job's outputs after every repeat,
    so a machine lost mid-benchmark keeps the repeats it finished (column ``repeat``)."""
    first = next(iter(by.values()))
    prompts = runner.load_prompts(first)
    with GpuSlots(1, label=label) as alloc:
        points = {(n, b): runner.Point(b, j, j.outputs[b]) for n, j in by.items() for b in batches}
        for p in points.values():
            p.head = header(p.meta_run(), alloc.ids, alloc.nvml_indices)
        with VllmServer(runner.server_spec(first, alloc, max(batches), "alternate")) as srv:
            log.info("server up in %.1f s, KV cache %s tokens", srv.startup_s, srv.kv_cache_tokens)
            for repeat in range(repeats):
                for b in batches:
                    for name in order(tuple(by), repeat):
                        if before is not None:
                            before(name, srv)
                        p = points[(name, b)]
                        m = runner.measure_point(p, srv, alloc, prompts, where=f"at batch {b} ({name})")
                        p.runs.append(m)
                        log.info(RUN_LINE, repeat, b, name, m.meta["loads"][0]["n_ok"],
                                 m.meta["loads"][0]["duration_s"] or 0)  # fmt: skip
                for p in points.values():
                    write_point(p.paths, p.head, p.runs)


def repeat_throughputs(out: Path, level: str) -> pl.DataFrame:
    """One row per measured repeat of every ``out/<model>/<level>/bs<b>.requests.parquet`` (its summary,
    :func:`slmserve.analysis.summarize_repeats`, with ``path``)."""
    paths = sorted(str(p) for p in out.glob("*/*/bs*.requests.parquet"))
    if not paths:
        raise SystemExit(f"{out}: no */<{level}>/bs*.requests.parquet here; run `run` first")
    rows = pl.DataFrame([r for p in paths for r in analysis.summarize_repeats(p)], infer_schema_length=None)
    return rows.filter(pl.col("status") == "ok")


def setting_samples(out: Path, settings: tuple[str, ...]) -> list[tuple[str, int, dict[str, list[float]]]]:
    """Per model and batch (in the order measured), each setting's throughput (req/s) of every repeat, read
    from ``out/<model>/<setting>/bs<b>.requests.parquet`` (:func:`repeat_throughputs`)."""
    rows = repeat_throughputs(out, "setting").with_columns(
        setting=pl.col("path").str.extract(rf"/({'|'.join(settings)})/bs")
    )
    return [(model, batch, {s: g.filter(pl.col("setting") == s)["throughput_rps"].to_list() for s in settings})
            for (model, batch), g in rows.group_by("model", "batch_size", maintain_order=True)]  # fmt: skip


def log_samples(log_path: Path, settings: tuple[str, ...]) -> list[tuple[str, int, dict[str, list[float]]]]:
    """:func:`setting_samples` from :func:`alternate`'s log instead of its result files, for runs whose files
    were lost: each run's throughput is its requests over its duration (``throughput_rps``, the window from
    first send to last end), as logged to 10 ms, about 0.06% of a 17 s run. The model is the GPU slot's label."""
    text = log_path.read_text()
    label = _LABEL_RE.search(text)
    if label is None:
        raise SystemExit(f"{log_path}: no \"'<model> ...' holds GPU\" line; is it a bench/ benchmark's log?")
    by: dict[int, dict[str, list[float]]] = {}
    for _, batch, setting, n, dur in _RUN_RE.findall(text):
        if setting in settings and float(dur) > 0:
            by.setdefault(int(batch), {s: [] for s in settings})[setting].append(int(n) / float(dur))
    if not by:
        raise SystemExit(f"{log_path}: no measured run of {', '.join(settings)} in it")
    return [(label[1], batch, samples) for batch, samples in by.items()]


def paired_columns(by: dict[str, list[float]]) -> dict[str, Any]:
    """For two named samples of throughput (first / second): each one's n, mean and 95% CI, and the ratio
    of their means with its 95% CI (:func:`slmserve.stats.ratio_ci`)."""
    row: dict[str, Any] = {}
    for name, xs in by.items():
        d = stats.describe(xs)
        row.update({f"{name}_n": d["n"], f"{name}_mean": d["mean"], f"{name}_ci_lo": d["ci_lo"],
                    f"{name}_ci_hi": d["ci_hi"]})  # fmt: skip
    r = stats.ratio_ci(*by.values())
    return {**row, "ratio": r["ratio"], "ratio_ci_lo": r["ci_lo"], "ratio_ci_hi": r["ci_hi"]}


def write_table(frame: pl.DataFrame, out: Path, precision: int) -> pl.DataFrame:
    """Write ``frame`` as ``out/compare.csv``, print it and return it."""
    frame.write_csv(out / "compare.csv")
    with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=220, float_precision=precision):
        print(frame)
    return frame


def scheduler_runs(rows: pl.DataFrame, variant: str) -> pl.DataFrame:
    """The scheduler runs that restart variant ``restart<suffix>`` is compared with: ``scheduler<suffix>``
    (the same settings, e.g. ``--graphs``) where they were measured, else the plain ``scheduler`` runs (whose
    CUDA-graph sizes, 2 x 512 capped at 512, are what ``--graphs 512`` pins)."""
    own = rows.filter(pl.col("path").str.contains(f"/scheduler{variant.removeprefix('restart')}/", literal=True))
    return own if own.height else rows.filter(pl.col("path").str.contains("/scheduler/", literal=True))


def compare(args: argparse.Namespace) -> pl.DataFrame:
    rows = repeat_throughputs(args.out, "mode").with_columns(
        mode=pl.col("path").str.extract(r"/(scheduler|restart|client)[^/]*/bs"),
        variant=pl.col("path").str.extract(r"/(restart[^/]*)/bs"),
    )
    out = []
    for (model, variant, batch), g in rows.filter(pl.col("mode") == "restart").group_by(
        "model", "variant", "batch_size", maintain_order=True
    ):
        ref = scheduler_runs(rows.filter(pl.col("model") == model, pl.col("batch_size") == batch), variant)
        row = paired_columns({"scheduler": ref["throughput_rps"].to_list(), "restart": g["throughput_rps"].to_list()})
        verdict = stats.verdict(row["ratio_ci_lo"], row["ratio_ci_hi"], AGREEMENT)
        out.append({"model": model, "restart": variant, "batch_size": batch, **row, "verdict": verdict})
    return write_table(pl.DataFrame(out).sort("model", "restart", "batch_size"), args.out, precision=3)


def cli(doc: str | None, run_args: Callable[[argparse.ArgumentParser], None], run: Callable[[argparse.Namespace], Any],
        compare: Callable[[argparse.Namespace], Any], argv: list[str] | None = None,
        compare_args: Callable[[argparse.ArgumentParser], None] | None = None) -> int:  # fmt: skip
    """The benchmarks' command line: ``run --model M --prompts P --out DIR`` plus ``run_args``, and
    ``compare DIR`` plus ``compare_args``; logs at INFO and dispatches."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True, choices=sorted(MODELS))
    r.add_argument("--prompts", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    run_args(r)
    c = sub.add_parser("compare")
    c.add_argument("out", type=Path)
    if compare_args is not None:
        compare_args(c)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(args) if args.cmd == "run" else compare(args)
    return 0


def smoke_args(r: argparse.ArgumentParser) -> None:
    """``--output-len`` and ``--dtype``: a smaller workload for a CPU-engine smoke run (:func:`shrunk`)."""
    r.add_argument("--output-len", type=int, default=None, help="output tokens (default 256; CPU smoke runs)")
    r.add_argument("--dtype", default=None, help="default float16; float32 on the CPU engine")


def shrunk(job: runner.SweepJob, args: argparse.Namespace, **fields: Any) -> runner.SweepJob:
    """``job`` with the smoke-run arguments that were given (:func:`smoke_args`) and ``fields``."""
    given = {k: v for k, v in (("output_len", args.output_len), ("dtype", args.dtype)) if v}
    return dataclasses.replace(job, **given, **fields)


def setting_outputs(out: Path, model: str, setting: str, batches: list[int]) -> dict[int, tuple[Path, Path]]:
    """Where a setting's points go: ``out/<model>/<setting>/bs<b>.{requests,telemetry}.parquet``."""
    where = out / model / setting
    return {b: (where / f"bs{b}.requests.parquet", where / f"bs{b}.telemetry.parquet") for b in batches}


def run_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--modes", nargs="+", default=["scheduler", "restart"], choices=runner.MODES)
    r.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256, 512])
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--graphs", type=int, default=None, help="--max-cudagraph-capture-size of every server")
    r.add_argument("--requests", type=int, default=500,
                   help="requests per point (small batches: --rounds); the prompts file must hold them")  # fmt: skip
    r.add_argument("--rounds", type=int, default=64,
                   help="small batches measure max(rounds, rounds x batch) requests, at most --requests")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return cli(__doc__, run_args, run, compare, argv)


if __name__ == "__main__":
    raise SystemExit(main())
