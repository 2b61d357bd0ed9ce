"""Figures 3 and 8 and the extras against batch size: SM activity and occupancy (Figure 3), GPU utilisation
and throughput (Figure 8), DRAM bandwidth and energy per output token (beyond the paper), on one GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import polars as pl

from slmserve.figures.captions import caption, energy_note, point_notes
from slmserve.figures.names import finite, main_workload, named, ok_runs, one_gpu
from slmserve.figures.shapes import Panel, batch_lines, batch_long, log_ci_notes

# --- Figures 3, 8 and extras: metrics against batch size -------------------------------------------


def _batch_figure(
    summary: pl.DataFrame, panels: Sequence[Panel], *, title: str, what: str, notes: list[str], y_log: bool = False
) -> tuple[alt.TopLevelMixin, str]:
    """A figure of metrics against batch size on one GPU (tp == 1), all-at-once workload."""
    frame = one_gpu(summary)
    runs, left_out = main_workload(ok_runs(frame))
    runs, order = named(runs)
    data = batch_long(runs, panels)
    chart = batch_lines(data, panels, title=title, order=order, y_log=y_log)
    metrics = [c for _, _, cols in panels for c in cols.values()]
    telemetry = [c for c in metrics if c not in ("throughput_rps", "latency_mean_s")]
    plotted = finite(runs, ["batch_size"]).filter(pl.any_horizontal(pl.col(c).is_not_null() for c in metrics)) \
        if set(metrics) <= set(runs.columns) else runs.head(0)  # fmt: skip
    notes = [*notes, *point_notes(plotted, metrics)]
    if y_log:  # an interval reaching 0 is not drawn on the log axis: say where
        notes += [n for m in metrics for n in log_ci_notes(plotted, m)]
    if "energy_per_token_j" in metrics:
        notes += energy_note(plotted)
    return chart, caption(frame, what, left_out + notes, telemetry=telemetry)


def sm_metrics(summary: pl.DataFrame) -> tuple[alt.TopLevelMixin, str]:
    """Figure 3: SM activity and SM occupancy (%), mean and max over the run, against batch size (log2),
    a color per model, one GPU."""
    panels = [
        ("SM activity", "SM activity (%)", {"mean": "sm_active_mean", "max": "sm_active_max"}),
        ("SM occupancy", "SM occupancy (%)", {"mean": "sm_occupancy_mean", "max": "sm_occupancy_max"}),
    ]
    notes = [
        "Per repeat, the mean and the maximum over the 100 ms samples of its measurement window (the paper: over all "
        "time steps); a point is the mean over repeats of each (for max: the repeats' maxima averaged, not the "
        "largest of them)."
    ]
    return _batch_figure(
        summary, panels, title="SM activity and occupancy on one GPU (Figure 3)",
        what="Figure 3: SM activity and SM occupancy (mean, max) vs batch size, one GPU", notes=notes,
    )  # fmt: skip


def util_throughput(summary: pl.DataFrame) -> tuple[alt.TopLevelMixin, str]:
    """Figure 8: average GPU utilisation (%) and throughput (requests/s) against batch size per model, one GPU."""
    panels = [
        ("GPU utilisation", "Average GPU utilisation (%)", {"mean": "gpu_util_mean"}),
        ("Throughput", "Throughput (requests/s)", {"mean": "throughput_rps"}),
    ]
    notes = ["GPU utilisation: NVML utilization.gpu (what DCGM_FI_DEV_GPU_UTIL reports), share of time a kernel ran."]
    return _batch_figure(
        summary, panels, title="GPU utilisation and throughput (Figure 8)",
        what="Figure 8: average GPU utilisation and throughput vs batch size, one GPU", notes=notes,
    )  # fmt: skip


def dram_bandwidth(summary: pl.DataFrame) -> tuple[alt.TopLevelMixin, str]:
    """Beyond the paper: DRAM bandwidth utilisation (%), mean and max, against batch size per model."""
    panels = [("DRAM bandwidth", "DRAM bandwidth utilisation (%)", {"mean": "dram_bw_mean", "max": "dram_bw_max"})]
    notes = [
        "Not in the paper. Its follow-up, Recasens et al., 'Mind the Memory Gap: Unveiling GPU Bottlenecks in "
        "Large-Batch LLM Inference' (2025), argues that large-batch inference stays memory-bound: DRAM bandwidth "
        "saturates while compute is underused, rather than the shift to a compute-bound regime that the paper "
        "gives for the throughput plateau (its Section 2.3). High DRAM utilisation at the batches where "
        "throughput stops growing supports that reading.",
        "DRAM bandwidth: NVML GPM DRAM_BW_UTIL (share of peak HBM bandwidth), per repeat the mean and max over the "
        "100 ms samples; a point is the mean over repeats of each (for max: the repeats' maxima averaged).",
    ]
    return _batch_figure(
        summary, panels, title="DRAM bandwidth utilisation on one GPU (beyond the paper)",
        what="DRAM bandwidth utilisation (mean, max) vs batch size, one GPU", notes=notes,
    )  # fmt: skip


def energy_per_token(summary: pl.DataFrame) -> tuple[alt.TopLevelMixin, str]:
    """Beyond the paper: GPU energy per output token (J) against batch size per model, one GPU."""
    panels = [("Energy per token", "GPU energy per output token (J)", {"mean": "energy_per_token_j"})]
    notes = [
        "Not in the paper (its Figure 4 shows power only). Energy: NVML's cumulative energy counter over the "
        "measurement window, summed over the job's GPUs, divided by the output tokens; log y axis."
    ]
    return _batch_figure(
        summary, panels, title="Energy per output token on one GPU (beyond the paper)",
        what="Energy per output token vs batch size, one GPU", notes=notes, y_log=True,
    )  # fmt: skip
