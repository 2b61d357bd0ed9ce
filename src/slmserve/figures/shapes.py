"""Figures: the altair theme and the three chart shapes the figures share (:func:`tradeoff_chart`,
:func:`batch_lines`, :func:`bar_chart`; the package docstring says which figure draws which), with their 95% CI
error bars and the "no data" note of an empty plot.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import polars as pl

from slmserve.figures.captions import METRIC_NAMES, ci_cols, point_name
from slmserve.figures.names import finite


def theme() -> dict:
    return {
        "config": {
            "font": "DejaVu Sans",
            "view": {"continuousWidth": 420, "continuousHeight": 300},
            "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True},
            "legend": {"labelFontSize": 11, "titleFontSize": 12},
            "title": {"fontSize": 14},
        }
    }


alt.theme.register("slmserve", enable=True)(theme)


# --- shared chart shapes --------------------------------------------------------------------------

TRADEOFF = ("throughput_rps", "latency_mean_s")  # the trade-off figures' metrics (both with a CI)


def color_scale(order: Sequence[str], field: str = "model", title: str = "Model", legend: bool = True) -> alt.Color:
    kwargs = {"sort": list(order), "scale": alt.Scale(domain=list(order))} if order else {}
    return alt.Color(f"{field}:N", title=title, **kwargs, **({} if legend else {"legend": None}))


def no_data() -> alt.Chart:
    """A gray "no data" note in the middle of an empty plot (its own one-row sequence, not a dataset)."""
    note = alt.Chart(alt.sequence(0, 1)).mark_text(fontSize=13, color="gray")
    return note.encode(x=alt.value(210), y=alt.value(150), text=alt.value("no data (see caption)"))


def tradeoff_chart(
    data: pl.DataFrame,
    *,
    title: str,
    label: str,
    order: Sequence[str] = (),
    color: str = "model",
    color_title: str = "Model",
    shape: str | None = None,
    shape_title: str | None = None,
    log_x: bool = True,
) -> alt.LayerChart:
    """Throughput (requests/s) against mean latency: one line per ``series``, points labelled by ``label``
    and connected in its order. Layers: lines, points, labels."""
    x_scale = alt.Scale(type="log") if log_x else alt.Scale(zero=False)
    base = alt.Chart(data).encode(
        x=alt.X("latency_mean_s:Q", title=X_LATENCY, scale=x_scale),
        y=alt.Y("throughput_rps:Q", title=Y_THROUGHPUT),
        color=color_scale(order, color, color_title),
    )
    lines = base.mark_line().encode(detail="series:N", order=f"{label}:Q")
    points = base.mark_point(filled=True, size=50).encode(
        tooltip=[c for c in data.columns if c != "series"],
    )
    if shape:
        lines = lines.encode(strokeDash=alt.StrokeDash(f"{shape}:N", legend=None))
        points = points.encode(shape=alt.Shape(f"{shape}:N", title=shape_title))
    labels = base.mark_text(dy=-9, fontSize=9).encode(text=f"{label}:Q")
    layers = [lines, points, labels, *_tradeoff_ci(base, data, x_scale, log_x)]
    return alt.layer(*layers, *([no_data()] if data.is_empty() else [])).properties(title=title)


X_LATENCY, Y_THROUGHPUT = "Mean end-to-end latency (s)", "Throughput (requests/s)"


def _tradeoff_ci(base: alt.Chart, data: pl.DataFrame, x_scale: alt.Scale, log_x: bool) -> list[alt.Chart]:
    """Error bars of the 95% CIs: vertical on throughput, horizontal on latency, where the data has them. On a
    log axis a latency interval reaching zero or below is left out (it would break the axis for every
    point); :func:`log_ci_notes` names those points in the caption."""
    bars = []
    if "throughput_rps_ci_lo" in data.columns:
        y = alt.Y("throughput_rps_ci_lo:Q", title=Y_THROUGHPUT)
        rule = base.mark_rule(strokeWidth=1.5).encode(y=y, y2="throughput_rps_ci_hi:Q")
        bars.append(rule.transform_filter("isValid(datum.throughput_rps_ci_lo)"))
    if "latency_mean_s_ci_lo" in data.columns:
        x = alt.X("latency_mean_s_ci_lo:Q", title=X_LATENCY, scale=x_scale)
        rule = base.mark_rule(strokeWidth=1.5).encode(x=x, x2="latency_mean_s_ci_hi:Q")
        positive = " && datum.latency_mean_s_ci_lo > 0" if log_x else ""
        bars.append(rule.transform_filter(f"isValid(datum.latency_mean_s_ci_lo){positive}"))
    return bars


def log_ci_notes(runs: pl.DataFrame, metric: str = "latency_mean_s") -> list[str]:
    """The caption's line on the points whose ``metric`` CI reaches zero or below: not drawn on a log axis."""
    col = f"{metric}_ci_lo"
    low = runs.filter(pl.col(col) <= 0) if col in runs.columns else runs.clear()
    if low.is_empty():
        return []
    which = ", ".join(
        f"{point_name(r)} (n = {r.get(f'{metric}_n') or r.get('n_repeats')})" for r in low.iter_rows(named=True)
    )
    return [f"The 95% CI of {METRIC_NAMES.get(metric, metric)} reaches zero or below at {which}: the log axis "
            "cannot draw it, so no bar there (the interval is in the summary)."]  # fmt: skip


# A panel of a batch-size figure: (panel title, y-axis title, {statistic: summary column}).
Panel = tuple[str, str, dict[str, str]]
_LONG_SCHEMA = {"model": pl.String, "batch_size": pl.Int64, "panel": pl.String, "stat": pl.String, "value": pl.Float64,
                "lo": pl.Float64, "hi": pl.Float64, "ok": pl.Boolean}  # fmt: skip


def window_ok(runs: pl.DataFrame) -> pl.Expr:
    """The summary's ``energy_window_ok`` (:func:`slmserve.analysis.energy_metrics`, true only where every repeat's
    window reached ENERGY_MIN_WINDOW_S); null where the summary does not record it. Only true is drawn as
    trusted."""
    if "energy_window_ok" not in runs.columns:
        return pl.lit(None, pl.Boolean)
    return pl.col("energy_window_ok").cast(pl.Boolean)


def batch_long(runs: pl.DataFrame, panels: Sequence[Panel]) -> pl.DataFrame:
    """One row per (run, panel, statistic): model, batch_size, panel, stat, value (nulls dropped), the 95% CI
    (lo, hi; null where the point has none) and ok (:func:`window_ok` for energy, else true; hollow unless true)."""
    frames = [
        runs.with_columns(ci_cols(runs, [col])).select(
            pl.col("model").cast(pl.String),
            pl.col("batch_size").cast(pl.Int64),
            panel=pl.lit(title),
            stat=pl.lit(stat),
            value=pl.col(col).cast(pl.Float64),
            lo=pl.col(f"{col}_ci_lo"),
            hi=pl.col(f"{col}_ci_hi"),
            ok=window_ok(runs) if col == "energy_per_token_j" else pl.lit(True),
        )
        for title, _, cols in panels
        for stat, col in cols.items()
        if col in runs.columns
    ]
    data = pl.concat(frames) if frames else pl.DataFrame(schema=_LONG_SCHEMA)
    return finite(data, ["batch_size", "value"]).sort(["panel", "stat", "model", "batch_size"])


def batch_lines(
    data: pl.DataFrame, panels: Sequence[Panel], *, title: str, order: Sequence[str], y_log: bool = False
) -> alt.TopLevelMixin:
    """Lines against batch size (log2 axis), a color per model, mean/max as line styles; one panel per
    entry of ``panels`` side by side, all drawn from the one long dataset of :func:`batch_long`."""
    ticks = sorted(set(data["batch_size"].to_list()))
    x = alt.X(
        "batch_size:Q",
        title="Batch size",
        scale=alt.Scale(type="log", base=2),
        axis=alt.Axis(values=ticks, format="d") if ticks else alt.Axis(format="d"),
    )
    charts = []
    for ptitle, ytitle, cols in panels:
        stats = list(cols)
        base = (
            alt.Chart()
            .transform_filter(alt.FieldEqualPredicate(field="panel", equal=ptitle))
            .encode(
                x=x,
                y=alt.Y("value:Q", title=ytitle, scale=alt.Scale(type="log") if y_log else alt.Scale()),
                color=color_scale(order),
            )
        )
        lines = base.mark_line().encode(detail="stat:N", order="batch_size:Q")
        points = base.mark_point(filled=True, size=35).encode(tooltip=["model", "batch_size", "stat", "value"])
        if len(stats) > 1:
            dash = alt.Scale(domain=stats, range=[[1, 0], [6, 3], [2, 2]][: len(stats)])
            lines = lines.encode(strokeDash=alt.StrokeDash("stat:N", title="Statistic", sort=stats, scale=dash))
            points = points.encode(shape=alt.Shape("stat:N", sort=stats, legend=None))
        errors = base.mark_rule(strokeWidth=1.5).encode(y=alt.Y("lo:Q", title=ytitle), y2="hi:Q")
        hollow = base.mark_point(filled=True, size=12).encode(color=alt.value("white"))
        drawable = "isValid(datum.lo)" + (" && datum.lo > 0" if y_log else "")  # log_ci_notes names the others
        layers = [lines, points, errors.transform_filter(drawable),
                  hollow.transform_filter("datum.ok !== true")]  # fmt: skip
        if data.filter(pl.col("panel") == ptitle).is_empty():  # say so on the chart (the caption says why)
            layers.append(no_data())
        charts.append(alt.layer(*layers, title=ptitle if len(panels) > 1 else title))
    if len(charts) == 1:
        return alt.layer(*charts[0].layer, data=data, title=title)
    return alt.hconcat(*charts, data=data, title=title)


def bar_chart(
    data: pl.DataFrame,
    *,
    y: str,
    y_title: str,
    title: str,
    order: Sequence[str],
    group: str | None = None,
    group_title: str | None = None,
    group_order: Sequence[str] = (),
    text: str | None = None,
    text_format: str = ".0f",
) -> alt.LayerChart:
    """Bars per model (in ``order``); grouped side by side by ``group`` (a color each) when given; each bar
    labelled with ``text`` (a string column) or else its value; error bars where the data has the 95% CI of
    ``y`` (``<y>_ci_lo``, ``<y>_ci_hi``); bars faded where ``energy_window_ok`` is not true (false or unknown)."""
    base = alt.Chart(data).encode(
        x=alt.X("model:N", title="Model", sort=list(order), axis=alt.Axis(labelAngle=0)),
        y=alt.Y(f"{y}:Q", title=y_title),
    )
    if group:
        sort = {"sort": list(group_order)} if group_order else {}
        base = base.encode(xOffset=alt.XOffset(f"{group}:N", **sort))
        color = alt.Color(f"{group}:N", title=group_title or group, **sort)
    else:
        color = color_scale(order, legend=False)
    bars = base.mark_bar().encode(color=color, tooltip=list(data.columns))
    if "energy_window_ok" in data.columns:  # a window too short to trust, or not known to be long enough: faded
        bars = bars.encode(opacity=alt.condition("datum.energy_window_ok !== true", alt.value(0.35), alt.value(1.0)))
    label = alt.Text(f"{text}:N") if text else alt.Text(f"{y}:Q", format=text_format)
    labels = base.mark_text(baseline="bottom", dy=-3, fontSize=10).encode(text=label)
    layers = [bars, labels]
    if f"{y}_ci_lo" in data.columns:
        errors = base.mark_rule(strokeWidth=1.5, color="black").encode(y=alt.Y(f"{y}_ci_lo:Q", title=y_title),
                                                                      y2=f"{y}_ci_hi:Q")  # fmt: skip
        layers.append(errors.transform_filter(f"isValid(datum.{y}_ci_lo)"))
    if data.is_empty():
        layers.append(no_data())
    return alt.layer(*layers).properties(title=title, width=420)
