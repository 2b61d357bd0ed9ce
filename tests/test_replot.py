"""Re-plotting from committed results: no measuring job runs, whatever the files' modification times;
and the paper's DAG refuses to start on a machine without GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import ROOT, snakemake

FIXTURES = ROOT / "tests/fixtures/results"
MEASURING = ("rule sweep", "rule kv_probe", "rule replication", "rule output_lengths")


@pytest.mark.skipif(not FIXTURES.exists(), reason="fixture results missing: run tests/fixtures/make_fixtures.sh")
def test_replot_from_fixture_results_runs_no_measurement(tmp_path: Path) -> None:
    out, fig = tmp_path / "results", tmp_path / "figs"
    shutil.copytree(FIXTURES, out)
    # A checkout gives arbitrary times: make every measured file look older than anything else.
    old = time.time() - 10 * 86400
    for path in out.rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))
    args = ["--configfile", "config/smoke.yaml", "--config", "replot=True", f"outdir={out}", f"figdir={fig}"]
    proc = snakemake("all", "--cores", "2", *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert not [r for r in MEASURING if r in log]
    for name in ("throughput_latency", "sm_metrics", "replication_tradeoff", "output_lengths", "families", "advisor"):
        assert (fig / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert "| OPT-125M | 125M | 250 MB | 512 |" in (fig / "table1.md").read_text()
    assert "| OPT-125M | " in (fig / "advisor.md").read_text()  # the batching advisor of the smoke sweep
    summary = pl.read_parquet(out / "summary/sweep.parquet")
    assert summary["batch_size"].sort().to_list() == [1, 2, 4, 8] and (summary["throughput_rps"] > 0).all()
    # nothing to do the second time
    again = snakemake("all", "-n", "--cores", "1", *args)
    assert "Nothing to be done" in again.stdout + again.stderr
    # re-plotting unchanged results rewrites identical bytes: a checkout stays clean
    before = {p: p.read_bytes() for p in [*out.glob("summary/*.parquet"), *fig.glob("*")] if p.is_file()}
    forced = snakemake("all", "--cores", "2", *args, "--forceall", timeout=600)
    assert forced.returncode == 0, forced.stderr[-3000:]
    changed = [str(p) for p, data in before.items() if p.read_bytes() != data]
    assert changed == [], changed

    report = snakemake("all", "--cores", "1", *args, "--report", str(tmp_path / "report.html"), timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    html = (tmp_path / "report.html").read_text(errors="replace")
    assert "throughput_latency" in html and "table1" in html
    # captions name the profile's own models and workload, not the paper's (smoke: OPT-125M, 128+16 tokens)
    assert "128+16-token" in html and "configured models (opt125m;" in html


@pytest.mark.skipif(not FIXTURES.exists(), reason="fixture results missing: run tests/fixtures/make_fixtures.sh")
def test_replot_of_an_unfinished_campaign_draws_what_is_there_and_names_the_rest(tmp_path: Path) -> None:
    out, fig = tmp_path / "results", tmp_path / "figs"
    shutil.copytree(FIXTURES, out)
    run = "runs/opt125m/tp1-out16-rateinf/bs8"
    for gone in (f"{run}.requests.parquet", f"{run}.telemetry.parquet", "replication/opt125m_r2.parquet",
                 "replication/opt125m_r2.telemetry.parquet"):  # fmt: skip
        (out / gone).unlink()
    args = ["--configfile", "config/smoke.yaml", "--config", "replot=True", f"outdir={out}", f"figdir={fig}"]
    proc = snakemake("all", "--cores", "2", *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert not [r for r in MEASURING if r in log]
    # 2 taken away, and the advisor's 2 plans that the fixtures (made before them) do not hold
    assert "replot: 4 of 13 measured results are not there yet" in log
    summary = pl.read_parquet(out / "summary/sweep.parquet").sort("batch_size")
    assert summary["status"].to_list() == ["ok", "ok", "ok", "not_measured"]
    caption = (fig / "throughput_latency.caption.md").read_text()
    assert "3 measured" in caption and "1 planned but not measured yet (no result file)" in caption
    fig5 = (fig / "replication_tradeoff.caption.md").read_text()
    assert "OPT-125M × 2 replicas: not measured yet" in fig5 and "OPT-125M advisor plan MPS: not measured yet" in fig5


def test_replot_without_results_says_there_is_nothing_to_plot(tmp_path: Path) -> None:
    proc = snakemake("all", "-n", "--cores", "1", "--config", "replot=True", f"outdir={tmp_path}")
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert f"none of the 247 measured results of this configuration is under {tmp_path}/" in text
    assert "nothing to plot" in text


def _gpus() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(_gpus(), reason="this machine has NVIDIA GPUs: the paper's DAG may run here")
def test_paper_dag_without_gpu_stops_at_once(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = snakemake("all", "--cores", "1", "--config", f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "no NVIDIA GPU visible" in text and "make demo" in text and "config/smoke.yaml" in text
    assert "rule prepare_dataset" not in text  # no job ran
    assert not (tmp_path / "results").exists()
    assert time.monotonic() - t0 < 60


def test_make_replot_skips_a_profile_that_holds_only_probes_it_does_not_draw(tmp_path: Path) -> None:
    """config/a100-36gb.yaml reuses Table 1's 36 GB probes (committed in its outdir) but draws no Table 1:
    `make replot` skips it until its replication runs are there, instead of failing on "nothing to plot"."""
    out = tmp_path / "a100"
    (out / "capacity").mkdir(parents=True)
    shutil.copy(ROOT / "results/a100-36gb/capacity/opt125m-36gb.json", out / "capacity")
    cfg = tmp_path / "a100.yaml"
    cfg.write_text((ROOT / "config/a100-36gb.yaml").read_text().replace("outdir: results/a100-36gb", f"outdir: {out}"))
    proc = subprocess.run(["make", "-o", "setup", "replot", f"REPLOT_CONFIGS={cfg}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert f"replot: {cfg}: no results in {out}/, skipped" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "WorkflowError" not in proc.stdout + proc.stderr and proc.returncode != 0  # nothing at all to re-plot
