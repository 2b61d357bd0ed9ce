"""GPU cost of a campaign, read from Snakemake's log (the committed log of the H100 quick-profile run)."""

from __future__ import annotations

import polars as pl

from bench import cost
from tests.conftest import ROOT

LOG = ROOT / "bench/results/h100-quick-partial/snakemake.log"


def test_jobs_and_seconds_from_the_h100_quick_run_log() -> None:
    jobs = cost.parse_log(LOG.read_text().splitlines(), "h100")
    probes = jobs.filter(pl.col("rule") == "kv_probe")
    assert probes["seconds"].to_list() == [108, 72, 97, 54, 70, 72]
    assert probes["wildcards"][0] == "model=opt125m, budget=whole"
    rules = cost.by_rule(jobs)
    row = dict(zip(rules["rule"], rules.select("finished", "unfinished", "seconds").rows(), strict=True))
    assert row == {"kv_probe": (6, 0, 473), "replication": (4, 1, 583), "sweep": (2, 0, 487)}
    # the replication job cut off by the end of the machine lease has a start and no end
    cut = jobs.filter(pl.col("end").is_null())
    assert cut.select("rule", "wildcards").row(0) == ("replication", "model=opt2.7b, n=2")
    assert "Figures 5-7" in cost.by_figure(jobs).filter(pl.col("rule") == "replication")["figures"].item()


def test_a_campaign_resumed_on_a_second_machine_adds_up_per_log() -> None:
    """The quick profile on the H100: 12 jobs + 1 cut off on one machine, the other 6 on a later one."""
    logs = [LOG, ROOT / "bench/results/h100-quick-resume/snakemake.log"]
    jobs = pl.concat([cost.parse_log(p.read_text().splitlines(), str(p)) for p in logs])
    rules = cost.by_rule(jobs)
    row = dict(zip(rules["rule"], rules.select("finished", "unfinished", "seconds").rows(), strict=True))
    assert row == {"kv_probe": (6, 0, 473), "replication": (9, 1, 1358), "sweep": (3, 0, 710)}
    # 25 min 45 s (13:54:22 -> 14:20:07) + 16 min 40 s (16:49:48 -> 17:06:28), not the 3 h between them
    assert cost.wall_seconds(jobs) == 1545 + 1000


def test_calibration_and_plans_count_as_gpu_time() -> None:
    """2026-11-24, one H100, one log of three Snakemake runs (job ids restart in each): calibration (2 points),
    the MPT-7B probe, 3 advisor plans (jobs 9, 5 and 0 of the second run), a sweep cut off."""
    jobs = cost.parse_log((ROOT / "bench/results/h100-paper-m1/snakemake.log").read_text().splitlines())
    rules = cost.by_rule(jobs)
    row = dict(zip(rules["rule"], rules.select("finished", "unfinished", "seconds").rows(), strict=True))
    assert row == {"calibration": (2, 0, 309), "kv_probe": (1, 0, 141), "replication_plan": (3, 0, 439),
                   "sweep": (0, 1, 0)}  # fmt: skip
    assert "calibration table" in cost.by_figure(jobs).filter(pl.col("rule") == "calibration")["figures"].item()


def test_parse_log_ignores_rule_all_and_text_between_jobs() -> None:
    lines = [
        "Building DAG of jobs...",
        "[Sat Nov 21 13:54:22 2026]",
        "rule sweep:",
        "    input: x",
        "    jobid: 3",
        "    wildcards: model=opt125m, tp=2, out=256, rate=inf",
        "    resources: gpu=2",
        "[Sat Nov 21 13:55:23 2026]",
        "Finished jobid: 3 (Rule: sweep)",
        "[Sat Nov 21 13:55:23 2026]",
        "localrule all:",
        "    jobid: 0",
        "[Sat Nov 21 13:55:24 2026]",
        "Finished jobid: 0 (Rule: all)",
    ]
    jobs = cost.parse_log(lines)
    assert jobs.select("rule", "jobid", "seconds").rows() == [("sweep", 3, 61)]
    assert cost.markdown(cost.by_rule(jobs)).splitlines()[2] == "| sweep | 1 | 0 | 61 | 61.0 |"
    assert cost.parse_log([]).height == 0
