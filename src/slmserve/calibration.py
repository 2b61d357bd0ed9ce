"""The calibration point of every machine side by side: how far machines differ on the same measurement.

As its first GPU job (rule ``calibrate``; a session may order it later), each machine measures one point per
calibration model (config ``calibration``: by default OPT-125M and OPT-1.3B at batch 256, 3 repeats), written
as ``calibration/<machine>/<model>.requests.parquet`` (:mod:`slmserve.machine` names the machine).
:func:`table` gives one row per such file: the machine, its GPU model and driver, host CPU model, cores,
CPUID and Python speed (:func:`slmserve.provenance.cpu_id`, :func:`slmserve.provenance.host_speed_ms`; null
in files written before 2026-11-29), the mean CPU steal over the repeats (``host_steal_frac``,
:func:`slmserve.telemetry.steal_frac`), engine version, batch, ``n`` repeats and the system throughput (req/s)
as mean, SD, ``cv = sd / mean`` and 95% CI (:func:`slmserve.stats.describe` over the repeats of
:func:`slmserve.analysis.summarize_repeats`), the repeats it measured beside other GPU jobs of the host
(``n_beside``, ``beside``: :func:`slmserve.analysis.beside_of`), and when it was measured. :func:`spread`:
per model and GPU model, the ratio of the largest machine mean to the smallest with its 95% CI (no claim
without 2 machines of one GPU model: an H200 beside H100s is another GPU, not a faster machine).
:func:`host_link`: per model and GPU model, the correlation of the machines' throughput with their host speed;
:func:`repeat_link`: the same within machines, repeat by repeat (:func:`repeats`), with the host's speed timed
around each repeat (``host_speed_repeat_ms``, :func:`slmserve.analysis.host_speed_of`; its mean over a point's
repeats is a column of :func:`table`), which a host's speed moving within minutes calls for. Both say too how
the ``r`` stands with one machine left out at a time (:func:`_without_each`): with few machines, one of them can
carry a verdict.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import polars as pl

from slmserve import analysis, io, layout, stats

COLUMNS = ("machine", "model", "gpu_model", "driver", "cpu_model", "cpu_cores", "cpu_id", "host_speed_ms",
           "host_speed_repeat_ms", "engine_version", "batch_size", "n", "throughput_rps", "throughput_rps_sd", "cv",
           "ci_lo", "ci_hi", "host_steal_frac", "n_beside", "beside", "created", "path")  # fmt: skip
_FLOATS = ("host_speed_ms", "host_speed_repeat_ms", "throughput_rps", "throughput_rps_sd", "cv", "ci_lo", "ci_hi",
           "host_steal_frac")  # fmt: skip


def _read(path: str | os.PathLike[str]) -> tuple[dict[str, str], dict[str, Any], list[dict[str, Any]]]:
    """A calibration file's layout keys, provenance and repeats (:func:`slmserve.analysis.summarize_repeats`);
    ValueError for a path not of the layout."""
    kind, keys = layout.parse(str(path))
    if kind != "calibration":
        raise ValueError(f"{path}: not a calibration file (calibration/<machine>/<model>.requests.parquet)")
    return keys, io.read_meta(path)["provenance"], analysis.summarize_repeats(path)


def _row(path: str | os.PathLike[str], keys: dict[str, str], prov: dict[str, Any],
         reps: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The calibration row of one file (module docstring) from what :func:`_read` gives."""
    d = stats.describe([r.get("throughput_rps") for r in reps])
    return {
        "machine": keys["machine"], "model": keys["model"], "gpu_model": analysis.gpu_model(prov),
        "driver": prov.get("driver"), "cpu_model": prov.get("cpu_model"), "cpu_cores": prov.get("cpu_cores"),
        "cpu_id": prov.get("cpu_id"), "host_speed_ms": prov.get("host_speed_ms"),
        "host_speed_repeat_ms": stats.describe([r.get("host_speed_repeat_ms") for r in reps])["mean"],
        "engine_version": prov.get("engine_version"), "batch_size": reps[0].get("batch_size"), "n": d["n"],
        "throughput_rps": d["mean"], "throughput_rps_sd": d["sd"],
        "cv": d["sd"] / d["mean"] if d["sd"] is not None and d["mean"] else None,
        "ci_lo": d["ci_lo"], "ci_hi": d["ci_hi"],
        "host_steal_frac": stats.describe([r.get("host_steal_frac") for r in reps])["mean"],
        **analysis.beside_of([r.get("beside") for r in reps]),
        "created": prov.get("created"), "path": str(path),
    }  # fmt: skip


def load(paths: Iterable[str | os.PathLike[str]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`table` and :func:`repeats` of the same files, each file read once."""
    rows, rep_rows = [], []
    for path in paths:
        keys, prov, reps = _read(path)
        rows.append(_row(path, keys, prov, reps))
        point = {k: rows[-1][k] for k in ("machine", "model", "gpu_model")}
        rep_rows += [{**point, "repeat": r.get("repeat"), "throughput_rps": r.get("throughput_rps"),
                      "host_speed_repeat_ms": r.get("host_speed_repeat_ms")} for r in reps]  # fmt: skip
    rep_schema = {"machine": pl.String, "model": pl.String, "gpu_model": pl.String, "repeat": pl.Int64,
                  "throughput_rps": pl.Float64, "host_speed_repeat_ms": pl.Float64}  # fmt: skip
    if not rows:
        frame = pl.DataFrame(schema={c: pl.Float64 if c in _FLOATS else pl.Utf8 for c in COLUMNS})
    else:
        frame = pl.DataFrame(rows, schema_overrides={c: pl.Float64 for c in _FLOATS}, infer_schema_length=None)
        frame = frame.select(COLUMNS).sort("model", "machine")
    return frame, pl.DataFrame(rep_rows, schema=rep_schema)


def table(paths: Iterable[str | os.PathLike[str]]) -> pl.DataFrame:
    """One row per calibration file (module docstring), by model then machine."""
    return load(paths)[0]


def spread(frame: pl.DataFrame) -> pl.DataFrame:
    """Per model and GPU model with 2 or more machines: ``machines``, the largest and smallest machine mean,
    their ``ratio`` and its 95% CI (``ratio_ci_lo``, ``ratio_ci_hi``: :func:`slmserve.stats.ratio_ci_of` from
    the two machines' n, mean and SD; null where one has a single repeat). The CI is that of these two
    machines; picking the extremes of several makes the ratio larger than that of two machines taken at random."""
    ok = frame.filter(pl.col("throughput_rps").is_not_null())
    rows = []
    for (model, gpu), group in ok.group_by("model", "gpu_model", maintain_order=True):
        if group.height < 2:
            continue
        by = group.sort("throughput_rps")
        low, high = by.row(0, named=True), by.row(-1, named=True)
        ci = stats.ratio_ci_of(*({"n": r["n"], "mean": r["throughput_rps"], "sd": r["throughput_rps_sd"]}
                                 for r in (high, low)))  # fmt: skip
        rows.append({"model": model, "gpu_model": gpu, "machines": group.height, "lowest": low["throughput_rps"],
                     "highest": high["throughput_rps"], "ratio": ci["ratio"], "ratio_ci_lo": ci["ci_lo"],
                     "ratio_ci_hi": ci["ci_hi"]})  # fmt: skip
    floats = ("lowest", "highest", "ratio", "ratio_ci_lo", "ratio_ci_hi")
    schema = {"model": pl.String, "gpu_model": pl.String, "machines": pl.Int64, **dict.fromkeys(floats, pl.Float64)}
    return pl.DataFrame(rows, schema=schema)


def _resolved_sign(ci_lo: float, ci_hi: float) -> int:
    """The sign a 95% CI of ``r`` resolves: 1 if it lies above 0, -1 if below, 0 if it contains 0."""
    return 1 if ci_lo > 0 else -1 if ci_hi < 0 else 0


_LOO_SCHEMA = {"r_loo_lo": pl.Float64, "r_loo_hi": pl.Float64, "loo_fits": pl.Int64, "loo_resolved": pl.Int64,
               "loo_weakest": pl.String, "loo_weakest_r": pl.Float64, "loo_weakest_ci_lo": pl.Float64,
               "loo_weakest_ci_hi": pl.Float64}  # fmt: skip


def _without_each(group: pl.DataFrame, full: dict[str, Any], fit: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The correlation ``fit`` (a :mod:`slmserve.stats` result, ``full`` that of the whole ``group``) again
    with each machine that takes part in ``full`` left out in turn (a machine whose leaving out changes no
    pair, as one with a single repeat within machines, gives no fit of its own): the lowest and highest of
    their ``r`` (``r_loo_lo``, ``r_loo_hi``), how many give one (``loo_fits``), how many of those have a 95% CI
    that excludes 0 on the side of ``full``'s r (``loo_resolved``), and the machine whose leaving out moves
    ``r`` furthest towards 0 or past it (``loo_weakest``) with that fit's r and CI."""
    fits = {}
    for m in group["machine"].unique(maintain_order=True):
        c = fit(group.filter(pl.col("machine") != m), permute=False)  # the p of each is not reported
        if c["r"] is not None and c["n"] < full["n"]:
            fits[m] = c
    if not fits:
        return {**dict.fromkeys(_LOO_SCHEMA), "loo_fits": 0, "loo_resolved": 0}
    sign = 1 if full["r"] >= 0 else -1
    weakest = min(fits, key=lambda m: sign * fits[m]["r"])
    rs = [c["r"] for c in fits.values()]
    return {"r_loo_lo": min(rs), "r_loo_hi": max(rs), "loo_fits": len(fits),
            "loo_resolved": sum(_resolved_sign(c["ci_lo"], c["ci_hi"]) == sign for c in fits.values()),
            "loo_weakest": weakest, "loo_weakest_r": fits[weakest]["r"], "loo_weakest_ci_lo": fits[weakest]["ci_lo"],
            "loo_weakest_ci_hi": fits[weakest]["ci_hi"]}  # fmt: skip


def _host_fit(g: pl.DataFrame, permute: bool = True) -> dict[str, Any]:
    return stats.correlation(g["host_speed_ms"].to_list(), g["throughput_rps"].to_list(), permute=permute)


def _repeat_fit(g: pl.DataFrame, permute: bool = True) -> dict[str, Any]:
    return stats.within_correlation(g["host_speed_repeat_ms"].to_list(), g["throughput_rps"].to_list(),
                                    g["machine"].to_list(), n_resamples=9999 if permute else 0)  # fmt: skip


def _links(ok: pl.DataFrame, fit: Callable[..., dict[str, Any]],
           extra: Callable[[pl.DataFrame, dict[str, Any]], dict[str, Any]],
           schema: dict[str, Any]) -> pl.DataFrame:  # fmt: skip
    """Per model and GPU model of ``ok``, where ``fit`` gives an ``r``: it with its CI and ``p_perm``, the
    columns ``extra`` takes from the group and the fit, and :func:`_without_each`."""
    rows = []
    for (model, gpu), g in ok.group_by("model", "gpu_model", maintain_order=True):
        c = fit(g)
        if c["r"] is not None:
            rows.append({"model": model, "gpu_model": gpu, **extra(g, c), "r": c["r"], "r_ci_lo": c["ci_lo"],
                         "r_ci_hi": c["ci_hi"], "p_perm": c["p_perm"], **_without_each(g, c, fit)})  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def host_link(frame: pl.DataFrame) -> pl.DataFrame:
    """Per model and GPU model with 4 or more machines that recorded a host speed: whether faster hosts
    measure more, as Pearson's ``r`` between ``host_speed_ms`` and the machines' mean throughput with its
    95% CI (:func:`slmserve.stats.correlation`; ``r`` < 0: the faster the Python, the more req/s), its
    permutation p-value ``p_perm``, the ``lowest`` and ``highest`` host speed behind it, and the same with one
    machine left out at a time (:func:`_without_each`)."""
    floats = ("r", "r_ci_lo", "r_ci_hi", "p_perm", "lowest", "highest")
    schema = {"model": pl.String, "gpu_model": pl.String, "machines": pl.Int64, **dict.fromkeys(floats, pl.Float64),
              **_LOO_SCHEMA}  # fmt: skip
    if "host_speed_ms" not in frame.columns:
        return pl.DataFrame(schema=schema)
    ok = frame.filter(pl.col("throughput_rps").is_not_null() & pl.col("host_speed_ms").is_not_null())
    return _links(ok, _host_fit, lambda g, c: {"machines": c["n"], "lowest": g["host_speed_ms"].min(),
                                               "highest": g["host_speed_ms"].max()}, schema)  # fmt: skip


def repeats(paths: Iterable[str | os.PathLike[str]]) -> pl.DataFrame:
    """One row per repeat of the calibration files: ``machine``, ``model``, ``gpu_model``, ``repeat``,
    ``throughput_rps`` and ``host_speed_repeat_ms`` (null in files written before it)."""
    return load(paths)[1]


def repeat_link(reps: pl.DataFrame) -> pl.DataFrame:
    """Per model and GPU model: whether a machine measures more in its repeats where its host ran faster, as
    Pearson's ``r`` of ``host_speed_repeat_ms`` and ``throughput_rps`` within machines (``r`` < 0: the faster
    the Python around a repeat, the more req/s in it) with its 95% CI and
    permutation p (:func:`slmserve.stats.within_correlation`), over the ``repeats`` of the ``machines`` with two
    or more repeats timed, and the same with one machine left out at a time (:func:`_without_each`); only where
    that gives an ``r``."""
    floats = ("r", "r_ci_lo", "r_ci_hi", "p_perm")
    schema = {"model": pl.String, "gpu_model": pl.String, "machines": pl.Int64, "repeats": pl.Int64,
              **dict.fromkeys(floats, pl.Float64), **_LOO_SCHEMA}  # fmt: skip
    ok = reps.filter(pl.col("throughput_rps").is_not_null() & pl.col("host_speed_repeat_ms").is_not_null())
    return _links(ok, _repeat_fit, lambda g, c: {"machines": c["groups"], "repeats": c["n"]}, schema)


def _resolved(r: dict[str, Any]) -> str:
    return "resolved" if _resolved_sign(r["r_ci_lo"], r["r_ci_hi"]) else "not resolved"


def _loo(r: dict[str, Any]) -> str:
    """``; one machine left out at a time: r -0.82 to -0.51, resolved with the same sign in 5 of 6; weakest
    without m3: r -0.51 [-0.85, 0.13]`` (``crossing 0`` after the range where some fits change sign)."""
    if not r["loo_fits"]:
        return "; no r with one machine left out"
    cross = ", crossing 0" if r["r_loo_lo"] < 0 < r["r_loo_hi"] else ""
    return (f"; one machine left out at a time: r {r['r_loo_lo']:.2f} to {r['r_loo_hi']:.2f}{cross}, resolved with "
            f"the same sign in {r['loo_resolved']} of {r['loo_fits']}; weakest without {r['loo_weakest']}: r "
            f"{r['loo_weakest_r']:.2f} [{r['loo_weakest_ci_lo']:.2f}, {r['loo_weakest_ci_hi']:.2f}]")  # fmt: skip


def _ratio(r: dict[str, Any]) -> str:
    """``1.302 [0.86, 1.74], not resolved``: the spread's ratio, its 95% CI and whether the CI excludes 1."""
    if r["ratio_ci_lo"] is None:
        return f"{r['ratio']:.3f}, no CI (a machine with one repeat)"
    said = "resolved" if r["ratio_ci_lo"] > 1 else "not resolved"
    return f"{r['ratio']:.3f} [{r['ratio_ci_lo']:.3f}, {r['ratio_ci_hi']:.3f}], {said}"


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _host(r: dict[str, Any]) -> str:
    """``Intel(R) Xeon(R) Processor (16; GenuineIntel 6/207/2; 0.452 ms, repeats 0.814 ms)``; the parts a file
    records."""
    speed = None if r.get("host_speed_ms") is None else f"{r['host_speed_ms']:.3f} ms"
    if speed and r.get("host_speed_repeat_ms") is not None:
        speed += f", repeats {r['host_speed_repeat_ms']:.3f} ms"
    parts = [str(x) for x in (r["cpu_cores"], r.get("cpu_id"), speed) if x is not None]
    return f"{r['cpu_model']} ({'; '.join(parts)})"


def to_markdown(frame: pl.DataFrame, reps: pl.DataFrame | None = None) -> str:
    """The table (req/s: mean [95% CI], n, CV) and, where 2 or more machines measured a model, its spread;
    with ``reps`` (:func:`repeats`), the link of throughput and host speed within machines."""
    head = ("| machine | GPU (driver) | host CPU (cores; CPUID; Python ms) | vLLM | model | batch | "
            "req/s mean [95% CI] | n | CV | CPU steal |\n"
            "|:---|:---|:---|:---|:---|---:|---:|---:|---:|---:|")  # fmt: skip
    body = [
        f"| {r['machine']} | {r['gpu_model']} ({r['driver'] or '-'}) | {_host(r)} | "
        f"{r['engine_version']} | {r['model']} | {r['batch_size']} | {_fmt(r['throughput_rps'])} "
        f"[{_fmt(r['ci_lo'])}, {_fmt(r['ci_hi'])}] | {r['n']} | "
        f"{_pct(r['cv'])} | {_pct(r.get('host_steal_frac'), 2)} |"
        for r in frame.iter_rows(named=True)
    ]
    sp = spread(frame)
    notes = [
        "",
        "One calibration point per machine (config `calibration`; slmserve.calibration), planned as its first "
        "GPU job (rule `calibrate`); the csv's `created` says when it ran. CI: Student's t over the repeats. "
        "Python ms: slmserve.provenance.host_speed_ms, a single-thread timing taken before the server started "
        '(lower is faster), and since commit 094ee05 the mean of those taken around each repeat ("repeats", '
        "slmserve.analysis.host_speed_of); CPU steal: the share of the CPU time the host wanted that its "
        "hypervisor kept, during the measured requests, mean over the repeats (slmserve.telemetry.steal_frac); "
        "both recorded since 2026-11-29.",
    ]
    notes += [f"- {r['model']} on {r['gpu_model']}: {r['machines']} machines, {_fmt(r['lowest'])} to "
              f"{_fmt(r['highest'])} req/s (highest / lowest {_ratio(r)})"
              for r in sp.iter_rows(named=True)]  # fmt: skip
    if sp.is_empty():
        notes.append("- No model has been calibrated on two machines of one GPU model yet: no spread between machines.")
    else:
        notes.append("- Highest / lowest: ratio of the two machines' means with its 95% CI (delta method, Welch df); "
                     "\"resolved\" where the CI excludes 1. Picked as the extremes of several machines, the ratio "
                     "overstates a typical pair's.")  # fmt: skip
    notes += [f"- {r['model']} on {r['gpu_model']}: host speed {r['lowest']:.3f} to {r['highest']:.3f} ms over "
              f"{r['machines']} machines; Pearson r with req/s {r['r']:.2f} [{r['r_ci_lo']:.2f}, {r['r_ci_hi']:.2f}] "
              f"(95% CI, Fisher z; approximate with few machines), "
              f"{_resolved(r)}; permutation p {r['p_perm']:.3f}{_loo(r)}"
              for r in host_link(frame).iter_rows(named=True)]  # fmt: skip
    notes += [f"- {r['model']} on {r['gpu_model']}, within machines: Pearson r of each repeat's req/s with the host "
              f"speed timed around it, {r['r']:.2f} [{r['r_ci_lo']:.2f}, {r['r_ci_hi']:.2f}] (95% CI, Fisher z "
              f"given the machine), {_resolved(r)}; permutation p within machines {r['p_perm']:.3f}; "
              f"{r['repeats']} repeats of {r['machines']} machines{_loo(r)}"
              for r in (repeat_link(reps).iter_rows(named=True) if reps is not None else ())]  # fmt: skip
    if not sp.is_empty() and frame["gpu_model"].n_unique() > 1:
        notes.append("- Machines of different GPU models are not one spread: each line above is one GPU model's.")
    if "n_beside" in frame.columns:  # a point meant to be measured alone that was not
        notes += [f"- {r['machine']} {r['model']}: {r['n_beside']} of {r['n']} repeats measured beside other GPU "
                  f"jobs of the host ({r['beside']}), which can slow a host-bound model"
                  for r in frame.filter(pl.col("n_beside") > 0).iter_rows(named=True)]  # fmt: skip
    return "\n".join([head, *body, *notes]) + "\n"
