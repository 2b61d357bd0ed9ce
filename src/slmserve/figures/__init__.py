"""Figures: altair charts from summary parquets, with one shared theme and caption.

Every figure function takes a summary frame and returns ``(chart, caption)``; :func:`save` writes PNG
and SVG (vl-convert), a self-contained HTML and the caption as Markdown. Which functions are figures, and
the summary each reads, is :data:`slmserve.layout.FIGURES`: each is looked up by name on this package, which
re-exports them. :func:`caption` is shared by all figures.

Three chart shapes are shared by the paper's figures: a throughput/latency trade-off (:func:`.shapes.tradeoff_chart`,
Figures 1, 2 and 5), lines against a log2 batch-size axis (:func:`.shapes.batch_lines`, Figures 3 and 8), and
bars per model, grouped by replicas where given (:func:`.shapes.bar_chart`, Figures 4, 6 and 7). Plotted data are
selected column by column, with nulls and non-finite values dropped, so a spec never carries inf/NaN
(CPU runs have no GPU telemetry: those figures render empty and say so in the caption).

The modules, each importing only those before it:

- :mod:`~slmserve.figures.names`: model names and their order by size, the run selection every figure starts
  from (measured runs, finite values, one GPU, the all-at-once workload, the largest batch), the names of a
  replication run's plan.
- :mod:`~slmserve.figures.captions`: :func:`caption` and the notes on the plotted points: repeats, 95% CIs,
  preemptions, energy windows.
- :mod:`~slmserve.figures.shapes`: the theme and the three chart shapes.
- :mod:`~slmserve.figures.tradeoff`: Figures 1 and 2 (throughput/latency trade-offs).
- :mod:`~slmserve.figures.batch`: Figures 3 and 8 and the extras against batch size.
- :mod:`~slmserve.figures.power_bars`: Figure 4 (power at the largest batch).
- :mod:`~slmserve.figures.replication`: Figures 5-7 and the extra on replicas.
- :mod:`~slmserve.figures.output`: :func:`save`.
"""

from __future__ import annotations

from slmserve.figures.batch import dram_bandwidth, energy_per_token, sm_metrics, util_throughput
from slmserve.figures.captions import caption, engines, hardware, point_name, values
from slmserve.figures.names import display_name, main_workload, model_names, named
from slmserve.figures.output import save
from slmserve.figures.power_bars import power
from slmserve.figures.replication import (
    energy_per_token_replicas,
    replication_gpu_util,
    replication_power,
    replication_tradeoff,
)
from slmserve.figures.shapes import color_scale, no_data
from slmserve.figures.tradeoff import families, output_lengths, throughput_latency

__all__ = [
    "caption",
    "color_scale",
    "display_name",
    "dram_bandwidth",
    "energy_per_token",
    "energy_per_token_replicas",
    "engines",
    "families",
    "hardware",
    "main_workload",
    "model_names",
    "named",
    "no_data",
    "output_lengths",
    "point_name",
    "power",
    "replication_gpu_util",
    "replication_power",
    "replication_tradeoff",
    "save",
    "sm_metrics",
    "throughput_latency",
    "util_throughput",
    "values",
]
