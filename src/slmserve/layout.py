"""Where every file of the workflow lives, and which experiments and figures there are.

Paths: :data:`TEMPLATES` holds one template per kind of file, relative to the results folder (``outdir``)
or, for figures, Table 1 and the batching advisor, the figure folder (``figdir``), with the rules' wildcard
names.
:class:`Layout` builds a path of one folder pair; a key left out stays a ``{wildcard}``, which is how a
rule's output pattern is written. :func:`parse` reads the keys back from a path under any folder.

Registry: :data:`FIGURES` (name -> :class:`Figure`, in the paper's order: Figure 1 ... 8, then those
beyond the paper) and :data:`EXPERIMENTS`, the summaries the figures are drawn from, in that order.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slmserve.config import number_label, rate_label

if TYPE_CHECKING:
    import altair as alt
    import polars as pl


@dataclass(frozen=True)
class Figure:
    """One figure: its file stem and rule (``figure_<name>``), the function of :mod:`slmserve.figures` of
    the same name that draws it, and the summary (experiment) it is drawn from."""

    name: str
    source: str

    @property
    def draw(self) -> Callable[[pl.DataFrame], tuple[alt.TopLevelMixin, str]]:
        # looked up on use: slmserve.figures imports analysis, which imports this module
        from slmserve import figures

        return getattr(figures, self.name)

    @property
    def caption_rst(self) -> str:
        """The report's caption of the figure, relative to the repository root."""
        return f"report/{self.name}.rst"


FIGURES: dict[str, Figure] = {
    f.name: f
    for f in (
        Figure("throughput_latency", "sweep"),  # Figure 1
        Figure("families", "families"),  # Figure 2 left
        Figure("output_lengths", "output_lengths"),  # Figure 2 right
        Figure("sm_metrics", "sweep"),  # Figure 3
        Figure("power", "sweep"),  # Figure 4
        Figure("replication_tradeoff", "replication"),  # Figure 5
        Figure("replication_gpu_util", "replication"),  # Figure 6
        Figure("replication_power", "replication"),  # Figure 7
        Figure("util_throughput", "sweep"),  # Figure 8
        Figure("dram_bandwidth", "sweep"),
        Figure("energy_per_token", "sweep"),
        Figure("energy_per_token_replicas", "replication"),
    )
}
# The experiments, one summary each: the figures' sources, in the order of FIGURES.
EXPERIMENTS: tuple[str, ...] = tuple(dict.fromkeys(f.source for f in FIGURES.values()))

# A number as config.number_label spells it, the only spelling a path takes: not 10.0 or 010.
_NUMBER = r"(0|[1-9]\d*)(\.\d*[1-9])?"
# Each wildcard's values (also the workflow's wildcard_constraints: a target outside them has no rule,
# e.g. 0 replicas); a model key is any folder name here, the Snakefile narrows it to the config's models.
WILDCARDS: dict[str, str] = {
    "model": r"[^/]+",
    "tp": r"1|2|4|8",  # the schema's tensor_parallel values
    "out": r"[1-9]\d*",
    "rate": rf"inf|{_NUMBER}",
    "bs": r"[1-9]\d*",
    "n": r"[1-9]\d*",
    "budget": rf"whole|(?!0gb){_NUMBER}gb",  # not 0 GB
    "input_len": r"[1-9]\d*",
    "num_requests": r"[1-9]\d*",
    "experiment": "|".join(EXPERIMENTS),
    "name": r"\w+",
    "machine": r"[a-z0-9][a-z0-9.-]*",
    "variant": r"plain|mps",
    "ext": r"png|svg|html|caption\.md|csv|md",
}

_RUN = "runs/{model}/tp{tp}-out{out}-rate{rate}"  # one sweep job: a file per batch size
_POINT = "points/{model}/tp{tp}-out{out}-rate{rate}"  # one (output length, rate) point
_REPLICATION = "replication/{model}_r{n}"
_PLAN = "replication/{model}_advisor-{variant}"  # the batching advisor's plan (slmserve.replication.advisor_plan)
_CALIBRATION = "calibration/{machine}/{model}"  # one machine's calibration point (slmserve.calibration)
TEMPLATES: dict[str, str] = {
    "prompts": "data/prompts-in{input_len}-n{num_requests}.parquet",
    "run": f"{_RUN}/bs{{bs}}.requests.parquet",
    "run_telemetry": f"{_RUN}/bs{{bs}}.telemetry.parquet",
    "point": f"{_POINT}.requests.parquet",
    "point_telemetry": f"{_POINT}.telemetry.parquet",
    "replication": f"{_REPLICATION}.parquet",
    "replication_telemetry": f"{_REPLICATION}.telemetry.parquet",
    "plan": f"{_PLAN}.parquet",
    "plan_telemetry": f"{_PLAN}.telemetry.parquet",
    "calibration": f"{_CALIBRATION}.requests.parquet",
    "calibration_telemetry": f"{_CALIBRATION}.telemetry.parquet",
    "capacity": "capacity/{model}-{budget}.json",
    "summary": "summary/{experiment}.parquet",
    "table1": "table1.{ext}",  # under figdir; before "figure", which its paths match too
    "advisor": "advisor.{ext}",  # under figdir (the batching advisor: table and figure); before "figure" too
    "calibration_table": "calibration.{ext}",  # under figdir: every machine's calibration point; before "figure"
    "figure": "{name}.{ext}",  # under figdir
}
# The kinds under figdir; every other kind is under outdir.
IN_FIGDIR = ("table1", "advisor", "calibration_table", "figure")
# The measured results whose summary row :func:`slmserve.analysis.planned_row` can write from the path alone.
MEASURED = ("run", "point", "replication", "plan")
FIGURE_EXTS = (".png", ".svg", ".html", ".caption.md")
TABLE1_EXTS = (".csv", ".md")  # also the calibration table's
ADVISOR_EXTS = (".csv", ".md", *FIGURE_EXTS)  # slmserve.advisor: its table and its figure


class _KeepMissing(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def fill(template: str, keys: Mapping[str, Any]) -> str:
    """``template`` with the values of ``keys``; a key not given stays ``{key}``."""
    # a rate given as a number is labelled as in file names; a string is a wildcard value already
    values = {k: rate_label(v) if k == "rate" and not isinstance(v, str) else str(v) for k, v in keys.items()}
    return template.format_map(_KeepMissing(values))


@dataclass(frozen=True)
class Layout:
    """Paths of one configuration: results under ``outdir``, figures and Table 1 under ``figdir``."""

    outdir: str = "results"
    figdir: str = "paper_figures"

    def path(self, kind: str, **keys: Any) -> str:
        """The path of a file of ``kind`` (a key of :data:`TEMPLATES`); keys left out stay wildcards."""
        folder = self.figdir if kind in IN_FIGDIR else self.outdir
        return f"{folder}/{fill(TEMPLATES[kind], keys)}"

    def capacity(self, model: str = "{model}", budget: str | float = "{budget}") -> str:
        """A KV-cache probe: ``budget`` is ``"whole"`` (the configured share of the GPU) or GB, as ``36gb``."""
        return self.path(
            "capacity", model=model, budget=budget if isinstance(budget, str) else f"{number_label(budget)}gb"
        )

    def figure_stem(self, name: str) -> str:
        return f"{self.figdir}/{name}"

    def figure_files(self, name: str) -> list[str]:
        """A figure's PNG, SVG, HTML and caption (:func:`slmserve.figures.save` writes them)."""
        return [self.path("figure", name=name, ext=ext.removeprefix(".")) for ext in FIGURE_EXTS]

    def table1_files(self) -> list[str]:
        return [self.path("table1", ext=ext.removeprefix(".")) for ext in TABLE1_EXTS]

    def calibration_table_files(self) -> list[str]:
        """Every machine's calibration point (CSV, Markdown; :mod:`slmserve.calibration`)."""
        return [self.path("calibration_table", ext=ext.removeprefix(".")) for ext in TABLE1_EXTS]

    def advisor_files(self) -> list[str]:
        """The batching advisor's table (CSV, Markdown) and figure (:mod:`slmserve.advisor`)."""
        return [self.path("advisor", ext=ext.removeprefix(".")) for ext in ADVISOR_EXTS]


def _regex(template: str) -> re.Pattern[str]:
    """A template as a regex that finds it at the end of a path under any folder."""
    parts = re.split(r"\{(\w+)\}", template)
    body = "".join(f"(?P<{part}>(?:{WILDCARDS[part]}))" if i % 2 else re.escape(part) for i, part in enumerate(parts))
    return re.compile(f"(?:^|/){body}$")


def parse(path: str) -> tuple[str, dict[str, str]]:
    """(kind, keys) of a path built from :data:`TEMPLATES`: ``.../runs/opt1.3b/tp2-out256-rateinf/bs64.requests
    .parquet`` -> ``("run", {"model": "opt1.3b", "tp": "2", "out": "256", "rate": "inf", "bs": "64"})``.
    Raises ValueError for any other path."""
    for kind, pattern in _PATTERNS.items():
        if m := pattern.search(str(path)):
            return kind, m.groupdict()
    raise ValueError(f"{path}: not a path of the workflow's layout (slmserve.layout.TEMPLATES)")


_PATTERNS = {kind: _regex(template) for kind, template in TEMPLATES.items()}


def telemetry_path(requests_path: str | os.PathLike[str]) -> Path:
    """The telemetry parquet beside a requests parquet: ``x.requests.parquet`` -> ``x.telemetry.parquet``,
    ``x.parquet`` -> ``x.telemetry.parquet`` (the ``*_telemetry`` kinds of :data:`TEMPLATES`)."""
    p = Path(requests_path)
    stem = p.name.removesuffix(".parquet").removesuffix(".requests")
    return p.with_name(f"{stem}.telemetry.parquet")
