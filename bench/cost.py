"""What a campaign cost in GPU time: job start and end read from Snakemake's own log, summed per rule
and per figure (a measuring job counts towards every figure drawn from its results).

Snakemake writes, for each job, a ``[<ctime>]`` line, ``rule NAME:`` (``localrule`` when run on the
host), the job's ``jobid`` and ``wildcards``, and later ``[<ctime>]`` + ``Finished jobid: N (Rule: NAME)``.
Jobs started but not finished (a run cut off) are kept with no end and null seconds: the log does not say
when they stopped, so the sums cover finished jobs only and ``unfinished`` counts the others.
One log may hold several Snakemake runs one after another (``bench/gpu_dag.sh`` stages); job ids restart
with each run's "Building DAG of jobs...".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime

import polars as pl

# GPU (measuring) rules and what each one's results are drawn into (slmserve.layout.FIGURES by source).
RULE_FIGURES: Mapping[str, str] = {
    "kv_probe": "Table 1 (and the batch of output-length and replication runs)",
    "sweep": "Figures 1, 3, 4, 8, DRAM bandwidth, energy per token (Figure 2 left for family models)",
    "output_lengths": "Figure 2 right",
    "replication": "Figures 5-7, energy per token with replicas",
    "replication_plan": "Figures 5-7: the batching advisor's plans",
    "calibration": "the machine-to-machine spread (calibration table)",
}
_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")
_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")
_NEW_RUN = "Building DAG of jobs..."


def _when(stamp: str) -> datetime:
    return datetime.strptime(" ".join(stamp.split()), "%a %b %d %H:%M:%S %Y")


def parse_log(lines: Iterable[str], source: str = "") -> pl.DataFrame:
    """One row per job of one Snakemake log: rule, jobid, wildcards, start, end (null if unfinished),
    seconds. Jobs of rule ``all`` are left out."""
    jobs: dict[tuple[int, int], dict[str, object]] = {}  # (run, jobid): ids restart with each run
    run = 0
    stamp: datetime | None = None
    current: dict[str, object] | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        if line.startswith(_NEW_RUN):
            run, current = run + 1, None
        elif m := _STAMP.match(line):
            stamp, current = _when(m.group(1)), None
        elif (m := _RULE.match(line)) and stamp is not None:
            current = {"rule": m.group(1), "start": stamp, "wildcards": "", "source": source}
        elif current is not None and (m := _JOBID.match(line)):
            jobs[run, int(m.group(1))] = current
            current["jobid"] = int(m.group(1))
        elif current is not None and (m := _WILDCARDS.match(line)):
            current["wildcards"] = m.group(1)
        elif (m := _FINISHED.match(line)) and stamp is not None and (run, int(m.group(1))) in jobs:
            jobs[run, int(m.group(1))]["end"] = stamp
    rows = [{**job, "end": job.get("end")} for job in jobs.values() if job["rule"] != "all"]
    schema = {"source": pl.String, "rule": pl.String, "jobid": pl.Int64, "wildcards": pl.String,
              "start": pl.Datetime, "end": pl.Datetime}  # fmt: skip
    frame = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    return frame.with_columns(seconds=(pl.col("end") - pl.col("start")).dt.total_seconds()).sort("start")


def by_rule(jobs: pl.DataFrame) -> pl.DataFrame:
    """Finished and unfinished jobs and their seconds per rule (measuring rules only)."""
    gpu = jobs.filter(pl.col("rule").is_in(list(RULE_FIGURES)))
    return (
        gpu.group_by("rule")
        .agg(
            finished=pl.col("end").is_not_null().sum(),
            unfinished=pl.col("end").is_null().sum(),
            seconds=pl.col("seconds").sum(),
            mean_seconds=pl.col("seconds").mean(),
        )
        .sort("rule")
    )


def by_figure(jobs: pl.DataFrame) -> pl.DataFrame:
    """``by_rule`` with what each measuring rule's results are drawn into."""
    return by_rule(jobs).with_columns(figures=pl.col("rule").replace_strict(dict(RULE_FIGURES)))


def wall_seconds(jobs: pl.DataFrame) -> float:
    """Wall time of the runs: per log (``source``), first job start to last job end, summed -- a campaign
    resumed on another machine hours later is not charged for the time between its logs."""
    spans = jobs.group_by("source").agg(span=(pl.col("end").max() - pl.col("start").min()).dt.total_seconds())
    return float(spans["span"].fill_null(0).sum())


def markdown(table: pl.DataFrame) -> str:
    """A polars frame as a Markdown table (floats to one decimal)."""
    cells = [[f"{v:.1f}" if isinstance(v, float) else "" if v is None else str(v) for v in row] for row in table.rows()]
    head = ["| " + " | ".join(table.columns) + " |", "|" + "|".join("---" for _ in table.columns) + "|"]
    return "\n".join(head + ["| " + " | ".join(row) + " |" for row in cells]) + "\n"
