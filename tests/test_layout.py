"""The path registry: every kind of path builds and parses back, committed results are where the templates
say, and every registered figure has its drawing function and report caption."""

from __future__ import annotations

import inspect
import math

import pytest

from slmserve import figures, layout
from slmserve.layout import EXPERIMENTS, FIGURES, TEMPLATES, Layout
from tests.conftest import ROOT

KEYS = {
    "prompts": {"input_len": "512", "num_requests": "500"},
    "run": {"model": "opt1.3b", "tp": "2", "out": "256", "rate": "inf", "bs": "64"},
    "run_telemetry": {"model": "opt1.3b", "tp": "1", "out": "32", "rate": "10", "bs": "1"},
    "point": {"model": "opt6.7b", "tp": "1", "out": "32", "rate": "0.5"},
    "point_telemetry": {"model": "opt6.7b", "tp": "1", "out": "128", "rate": "100"},
    "replication": {"model": "opt2.7b", "n": "3"},
    "replication_telemetry": {"model": "opt2.7b", "n": "1"},
    "plan": {"model": "opt1.3b", "variant": "mps"},
    "plan_telemetry": {"model": "opt125m", "variant": "plain"},
    "calibration": {"machine": "h100-80gb-hbm3-1a2b3c4d", "model": "opt125m"},
    "calibration_telemetry": {"machine": "cpu-00ff00ff", "model": "opt1.3b"},
    "calibration_table": {"ext": "md"},
    "capacity": {"model": "gpt-j-6b", "budget": "36gb"},
    "summary": {"experiment": "output_lengths"},
    "table1": {"ext": "md"},
    "advisor": {"ext": "csv"},
    "figure": {"name": "throughput_latency", "ext": "caption.md"},
}


def test_every_kind_is_tested() -> None:
    assert set(KEYS) == set(TEMPLATES)


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_build_then_parse_gives_the_kind_and_keys_back(kind: str) -> None:
    paths = Layout("results/quick", "paper_figures/quick")
    path = paths.path(kind, **KEYS[kind])
    assert path.startswith("paper_figures/quick/" if kind in layout.IN_FIGDIR else "results/quick/")
    assert layout.parse(path) == (kind, KEYS[kind])
    assert layout.parse("/abs/" + path.split("/", 2)[2]) == (kind, KEYS[kind])  # under any folder


def test_the_paths_of_the_committed_results() -> None:
    paths = Layout()
    assert paths.path("run", model="opt125m", tp=1, out=256, rate=math.inf, bs=8) == (
        "results/runs/opt125m/tp1-out256-rateinf/bs8.requests.parquet"
    )
    assert paths.path("point", model="opt6.7b", tp=1, out=32, rate=10.0) == (
        "results/points/opt6.7b/tp1-out32-rate10.requests.parquet"
    )
    rep = paths.path("replication_telemetry", model="opt125m", n=2)
    assert rep == "results/replication/opt125m_r2.telemetry.parquet"
    assert paths.path("plan", model="opt125m", variant="mps") == "results/replication/opt125m_advisor-mps.parquet"
    assert paths.capacity("opt13b", 36) == "results/capacity/opt13b-36gb.json"
    assert paths.capacity("opt13b", "whole") == "results/capacity/opt13b-whole.json"
    assert paths.path("prompts", input_len=512, num_requests=500) == "results/data/prompts-in512-n500.parquet"
    assert paths.figure_files("power") == [f"paper_figures/power{ext}" for ext in layout.FIGURE_EXTS]
    assert paths.table1_files() == ["paper_figures/table1.csv", "paper_figures/table1.md"]
    assert paths.calibration_table_files() == ["paper_figures/calibration.csv", "paper_figures/calibration.md"]
    # every committed result file is a path of the layout, and builds back from its keys; a sweep's kept
    # repeats (slmserve.journal, `.partial/`, committed while the sweep spans machines) are not results yet
    files = [p for p in (ROOT / "results").rglob("*") if p.is_file() and ".partial" not in p.parts]
    files += [p for p in (ROOT / "tests/fixtures/results").rglob("*") if p.is_file()]
    assert files
    for file in files:
        rel = file.relative_to(ROOT).as_posix()
        kind, keys = layout.parse(rel)
        outdir = rel.removesuffix("/" + layout.fill(TEMPLATES[kind], keys))
        assert Layout(outdir).path(kind, **keys) == rel


def test_keys_left_out_stay_wildcards() -> None:
    paths = Layout("out", "figs")
    assert paths.path("run", bs=8) == "out/runs/{model}/tp{tp}-out{out}-rate{rate}/bs8.requests.parquet"
    assert paths.capacity(budget="whole") == "out/capacity/{model}-whole.json"
    assert paths.path("summary") == "out/summary/{experiment}.parquet"


def test_rates_are_labelled_as_in_file_names() -> None:
    assert layout.fill("rate{rate}", {"rate": math.inf}) == "rateinf"
    assert layout.fill("rate{rate}", {"rate": 10.0}) == "rate10"
    assert layout.fill("rate{rate}", {"rate": 0.5}) == "rate0.5"
    assert layout.fill("rate{rate}", {"rate": "100"}) == "rate100"  # a wildcard value, as it is


@pytest.mark.parametrize(
    "path", ["results/summary/other.parquet", "results/runs/opt125m/tp1-out256-rateinf/bs8.parquet", "notes.txt"]
)
def test_other_paths_do_not_parse(path: str) -> None:
    with pytest.raises(ValueError, match="not a path of the workflow's layout"):
        layout.parse(path)


def test_telemetry_beside_requests() -> None:
    assert layout.telemetry_path("a/bs8.requests.parquet").as_posix() == "a/bs8.telemetry.parquet"
    assert layout.telemetry_path("a/opt125m_r2.parquet").as_posix() == "a/opt125m_r2.telemetry.parquet"


def test_every_figure_is_drawn_by_its_function_and_has_a_report_caption() -> None:
    assert list(FIGURES)[:9] == [
        "throughput_latency", "families", "output_lengths", "sm_metrics", "power", "replication_tradeoff",
        "replication_gpu_util", "replication_power", "util_throughput",
    ]  # fmt: skip
    for name, fig in FIGURES.items():
        assert fig.name == name and fig.draw is getattr(figures, name)
        assert next(iter(inspect.signature(fig.draw).parameters)) == "summary", name
        assert (ROOT / fig.caption_rst).read_text().strip(), name
        assert fig.source in EXPERIMENTS, name


def test_experiments_are_the_figures_sources_in_order() -> None:
    assert EXPERIMENTS == ("sweep", "families", "output_lengths", "replication")
    assert set(EXPERIMENTS) == {fig.source for fig in FIGURES.values()}
    assert layout.parse("r/summary/replication.parquet") == ("summary", {"experiment": "replication"})
