"""Statistics of repeated measurements: mean, spread and 95% confidence intervals (t-distribution).

For ``n`` repeats ``x_1..x_n`` of a point: ``mean = sum(x) / n``; ``sd`` = the sample standard deviation
(``n - 1`` in the denominator); the 95% CI is ``mean ± t(0.975, n - 1) · sd / sqrt(n)`` (Student's t, from
scipy). With one repeat there is no spread and no interval (None).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as _st

LEVEL = 0.95


def describe(xs: Sequence[float | None]) -> dict[str, Any]:
    """``n``, ``mean``, ``sd``, ``ci_lo``, ``ci_hi`` (and ``ci_half``) of the non-null values of ``xs``;
    ValueError for a NaN or infinite value (a broken measurement must not leave the interval unnoticed)."""
    vals = [float(x) for x in xs if x is not None]
    bad = [(i, v) for i, v in enumerate(vals) if not math.isfinite(v)]
    if bad:
        i, v = bad[0]
        raise ValueError(
            f"value {v} at position {i} of {len(vals)} non-null values is not finite: a mean "
            "and interval over it would mislead; find the repeat that produced it and re-measure it"
        )
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "ci_lo": None, "ci_hi": None, "ci_half": None}
    mean = math.fsum(vals) / n
    if n == 1:
        return {"n": 1, "mean": mean, "sd": None, "ci_lo": None, "ci_hi": None, "ci_half": None}
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    half = _t_half(sd, n)
    return {"n": n, "mean": mean, "sd": sd, "ci_lo": mean - half, "ci_hi": mean + half, "ci_half": half}


def _t_half(sd: float, n: int) -> float:
    """The half-width of the 95% t-interval of a mean of ``n`` values whose sample SD is ``sd``."""
    return float(_st.t.ppf(0.5 + LEVEL / 2, n - 1)) * sd / math.sqrt(n)


def repeats_for(sd: float | None, half_width: float, limit: int = 100_000) -> int | None:
    """The fewest repeats ``n`` (at least 2) whose 95% t-interval of the mean, at the sample SD ``sd``, is
    no wider than ``± half_width``: the smallest n with ``t(0.975, n - 1) · sd / sqrt(n) <= half_width``. A
    planning figure from a pilot's SD, not a guarantee (the next repeats' SD differs); ``None`` without an
    SD, or when ``limit`` repeats would not do."""
    if sd is None or half_width <= 0:
        return None

    def enough(n: int) -> bool:
        return _t_half(sd, n) <= half_width

    if not enough(limit):
        return None
    lo, hi = 2, limit  # the half-width falls as n grows: bisect for the first n that is enough
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


def repeats_inside(mean: float | None, sd: float | None, tolerance: float, limit: int = 100_000) -> int | None:
    """The fewest repeats whose 95% t-interval around a ratio's ``mean``, at the sample SD ``sd``, would lie
    inside ``[1 - tolerance, 1 + tolerance]`` (:func:`equivalent`): :func:`repeats_for` with the half-width
    the mean leaves, ``tolerance - |mean - 1|``. A plan that assumes the mean stays where a pilot put it;
    ``None`` without a mean or SD, when the mean is at or past a bound (no count of repeats would do), or
    past ``limit``."""
    if mean is None or sd is None:
        return None
    return repeats_for(sd, tolerance - abs(mean - 1.0), limit)


def ratio_ci(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The ratio of means ``mean(a) / mean(b)`` of two independent samples and its 95% CI by the delta
    method: relative standard error ``sqrt(sd_a² / (n_a mean_a²) + sd_b² / (n_b mean_b²))``, with the
    Welch-Satterthwaite degrees of freedom of those two terms; the interval is ``ratio · (1 ± t · rse)``."""
    return ratio_ci_of(describe(a), describe(b))


def ratio_ci_of(da: Mapping[str, Any], db: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`ratio_ci` from each sample's ``n``, ``mean`` and ``sd`` (as :func:`describe` gives them, or a
    summary's ``n_repeats``, mean and ``_sd`` columns)."""
    if not da["n"] or not db["n"] or not db["mean"] or da["mean"] is None:
        return {"ratio": None, "ci_lo": None, "ci_hi": None}
    ratio = da["mean"] / db["mean"]
    if da["n"] < 2 or db["n"] < 2 or da["sd"] is None or db["sd"] is None:
        return {"ratio": ratio, "ci_lo": None, "ci_hi": None}
    va = da["sd"] ** 2 / (da["n"] * da["mean"] ** 2)
    vb = db["sd"] ** 2 / (db["n"] * db["mean"] ** 2)
    rse = math.sqrt(va + vb)
    if rse == 0:
        return {"ratio": ratio, "ci_lo": ratio, "ci_hi": ratio}
    df = (va + vb) ** 2 / (va**2 / (da["n"] - 1) + vb**2 / (db["n"] - 1))
    half = float(_st.t.ppf(0.5 + LEVEL / 2, df)) * rse * ratio
    return {"ratio": ratio, "ci_lo": ratio - half, "ci_hi": ratio + half}


def correlation(xs: Sequence[float], ys: Sequence[float], permute: bool = True) -> dict[str, Any]:
    """Pearson's ``r`` of paired values and its 95% CI by Fisher's z transform (scipy's ``pearsonr``):
    ``tanh(atanh(r) ± z(0.975) / sqrt(n - 3))``, and ``p_perm``, the two-sided p-value of r against all
    pairings of the values (exact up to 8 pairs, scipy's permutation test; None unless ``permute``), which
    needs no normality: with few pairs the interval is approximate. ``n`` pairs; fewer than 4, or values that
    do not vary, give no r (None)."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"{n} values against {len(ys)}: a correlation needs pairs")
    none = {"n": n, "r": None, "ci_lo": None, "ci_hi": None, "p_perm": None}
    if n < 4 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return none
    # one call: the permutation method sets the p-value; the interval stays Fisher's z
    method = _st.PermutationMethod(n_resamples=40320, random_state=0) if permute else None
    res = _st.pearsonr(xs, ys, method=method)
    ci = res.confidence_interval(LEVEL)
    return {"n": n, "r": float(res.statistic), "ci_lo": float(ci.low), "ci_hi": float(ci.high),
            "p_perm": float(res.pvalue) if permute else None}  # fmt: skip


def _groups_of_two(groups: Sequence[Any]) -> dict[Any, list[int]]:
    """The positions of each group's values, for the groups of two values or more (one value tells no spread
    within its group), in order of first appearance."""
    members: dict[Any, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    return {g: idx for g, idx in members.items() if len(idx) > 1}


def _kept_groups(values: Sequence[float], groups: Sequence[Any]) -> dict[Any, np.ndarray]:
    """Each group's values, for the groups of two values or more, in order of first appearance; the two
    sequences must be as long as each other."""
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} values against {len(groups)} group labels: each value needs its group")
    return {g: np.asarray([float(values[i]) for i in idx]) for g, idx in _groups_of_two(groups).items()}


def _any_flat(kept: Mapping[Any, np.ndarray]) -> bool:
    """Whether a group has no spread beyond rounding (1e-12 of its size)."""
    return any(math.isclose(vs.min(), vs.max(), rel_tol=1e-12) for vs in kept.values())


def within_correlation(xs: Sequence[float], ys: Sequence[float], groups: Sequence[Any],
                       n_resamples: int = 9999) -> dict[str, Any]:  # fmt: skip
    """Pearson's ``r`` of paired values within groups (a machine's repeats): the ``r`` of each value's
    deviation from its group's mean, so that what sets groups apart does not count. Its 95% CI by Fisher's z
    over ``N - k - 2`` degrees of freedom, ``tanh(atanh(r) ± z(0.975) / sqrt(N - k - 2))`` (``N`` pairs in
    ``k`` groups: a partial correlation given ``k - 1`` group indicators), and ``p_perm``, the two-sided
    p-value of ``|r|`` against ``n_resamples`` random pairings shuffled within each group (seeded), counting
    the observed one (None with ``n_resamples`` 0). Groups of one pair tell nothing within and are left out;
    ``n`` and ``groups`` count what remains. Fewer than ``k + 4`` pairs, or x or y constant within every
    group, give no r (None); an ``r`` of exactly ±1 has a CI of that one value."""
    if not len(xs) == len(ys) == len(groups):
        raise ValueError(f"{len(xs)} x, {len(ys)} y and {len(groups)} group values: a correlation needs triples")
    kept = list(_groups_of_two(groups).values())
    n, k = sum(map(len, kept)), len(kept)
    none = {"n": n, "groups": k, "r": None, "ci_lo": None, "ci_hi": None, "p_perm": None}
    if n < k + 4:
        return none
    if any(all(len({v[i] for i in idx}) < 2 for idx in kept) for v in (xs, ys)):
        return none  # no value moves within any group (tested on the values: rounding leaves deviations of 1e-17)
    x, y = (np.concatenate([np.asarray([v[i] for i in idx], float) - np.mean([v[i] for i in idx])
                            for idx in kept]) for v in (xs, ys))  # fmt: skip
    r = float(_st.pearsonr(x, y).statistic)
    half = _st.norm.ppf(0.5 + LEVEL / 2) / math.sqrt(n - k - 2)
    z = math.atanh(max(min(r, 1 - 1e-15), -1 + 1e-15))
    fit = {"n": n, "groups": k, "r": r, "ci_lo": math.tanh(z - half), "ci_hi": math.tanh(z + half), "p_perm": None}
    if n_resamples == 0:
        return fit
    rng = np.random.default_rng(0)
    bounds = np.cumsum([0, *map(len, kept)])
    shuffled = np.empty((n_resamples, n))
    for lo, hi in itertools.pairwise(bounds):  # each group's deviations shuffled among its own pairs
        shuffled[:, lo:hi] = rng.permuted(np.broadcast_to(y[lo:hi], (n_resamples, hi - lo)), axis=1)
    rs = (shuffled @ x) / (np.linalg.norm(shuffled, axis=1) * np.linalg.norm(x))
    p = (1 + int(np.sum(np.abs(rs) >= abs(r) - 1e-12))) / (1 + n_resamples)
    return {**fit, "p_perm": p}


def between_groups(values: Sequence[float], groups: Sequence[Any]) -> dict[str, Any]:
    """Whether groups of values (a pooled sample's machines) differ in mean: the Alexander-Govern test
    (scipy's ``alexandergovern``), a one-way comparison of ``k`` group means that, unlike the ANOVA F test,
    does not assume the groups vary alike (machines' pairs vary by SD 6-14%). Each group's mean is weighted by
    ``1 / (sd^2 / n)``; each group's t statistic against the weighted mean is normalized, and ``statistic`` =
    the sum of their squares, referred to chi-squared with ``k - 1`` degrees of freedom for ``p``. ``p`` is the
    chance of a statistic this large were every group's mean the same; a large ``p`` says the groups' means are
    within what their spread allows, not that they are equal: a test of a few groups of noisy values misses
    offsets smaller than each group's own CI. Groups of one value are left out; ``n`` and ``groups`` count
    what remains, ``means`` and ``counts`` are per group in order of first appearance. Fewer than two groups,
    or a group without spread (beyond 1e-12 of its size: rounding), give no ``statistic`` or ``p`` (None)."""
    kept = _kept_groups(values, groups)
    out = {"n": sum(map(len, kept.values())), "groups": len(kept), "statistic": None, "p": None,
           "means": {str(g): float(vs.mean()) for g, vs in kept.items()},
           "counts": {str(g): len(vs) for g, vs in kept.items()}}  # fmt: skip
    if len(kept) < 2 or _any_flat(kept):
        return out  # the test weights each group by its spread: none within a group leaves it undefined
    res = _st.alexandergovern(*kept.values())
    return {**out, "statistic": float(res.statistic), "p": float(res.pvalue)}


def across_groups(values: Sequence[float], groups: Sequence[Any]) -> dict[str, Any]:
    """The mean of groups' means when the groups (a pooled sample's machines) may differ: a random-effects
    meta-analysis (statsmodels' ``combine_effects``). Each group ``i`` gives its mean ``m_i`` and that mean's
    variance ``v_i = sd_i^2 / n_i``; ``tau2``, the variance of the groups' true means, is Paule-Mandel's: the
    ``tau2 >= 0`` at which ``sum w* (m - mean)^2 = k - 1``, with ``w* = 1 / (v + tau2)`` and ``mean = sum w* m /
    sum w*`` (0 where the means vary less than their own variances allow). The 95% CI is Hartung-Knapp-Sidik-
    Jonkman's: t on ``k - 1`` degrees of freedom times ``sqrt(max(1, s) / sum w*)``, ``s = sum w* (m - mean)^2 /
    (k - 1)``, never narrower than the plain random-effects interval. Unlike a CI of every value as one sample,
    it widens with the spread between the groups' means, so a few machines that differ give a wide interval.
    ``tau`` is ``sqrt(tau2)`` (the groups' SD in the values' unit), ``i2`` Higgins' I^2 (the share of the
    means' spread beyond chance; 0 where it is less), ``q`` Cochran's Q. Groups of one value are
    left out; fewer than two groups, or a group without spread, give ``mean`` None."""
    kept = _kept_groups(values, groups)
    out = {"n": int(sum(map(len, kept.values()))), "groups": len(kept), "mean": None, "ci_lo": None,
           "ci_hi": None, "tau": None, "i2": None, "q": None, "method": "Paule-Mandel, Hartung-Knapp t CI"}  # fmt: skip
    if len(kept) < 2 or _any_flat(kept):
        return out  # a group's mean without spread has no variance to weigh it by
    from statsmodels.stats.meta_analysis import combine_effects  # only pools need it (not on GPU hosts)

    means = np.asarray([vs.mean() for vs in kept.values()])
    var = np.asarray([vs.var(ddof=1) / len(vs) for vs in kept.values()])
    res = combine_effects(means, var, method_re="pm")
    k = len(kept)
    half = float(_st.t.ppf(0.5 + LEVEL / 2, k - 1) * res.sd_eff_w_re * math.sqrt(max(1.0, res.scale_hksj_re)))
    mean = float(res.mean_effect_re)
    return {**out, "mean": mean, "ci_lo": mean - half, "ci_hi": mean + half, "tau": math.sqrt(max(0.0, res.tau2)),
            "i2": max(0.0, float(res.i2)), "q": float(res.q)}  # fmt: skip


def summary_sample(row: Mapping[str, Any], metric: str = "throughput_rps") -> dict[str, Any]:
    """A summary row's ``metric`` as :func:`ratio_ci_of` takes it: ``n`` (the repeats with a value,
    ``<metric>_n``; ``n_repeats``, then 1, for rows written without it), ``mean`` and ``sd``."""
    return {"n": row.get(f"{metric}_n") or row.get("n_repeats") or 1, "mean": row.get(metric),
            "sd": row.get(f"{metric}_sd")}  # fmt: skip


def verdict(ci_lo: float | None, ci_hi: float | None, tolerance: float) -> str:
    """What a ratio's 95% CI ``[ci_lo, ci_hi]`` says of "the two are equal within ``tolerance``":
    ``agree`` if it contains 1 and its half-width is at most ``tolerance`` (then the ratio itself is within
    1 ± tolerance); ``differ`` if it excludes 1 (a difference the repeats resolve; its size is the ratio);
    ``inconclusive`` if it contains 1 but is wider (too few repeats for the spread), or there is no interval."""
    if ci_lo is None or ci_hi is None:
        return "inconclusive"
    if ci_hi < 1.0 or ci_lo > 1.0:
        return "differ"
    return "agree" if (ci_hi - ci_lo) / 2 <= tolerance + 1e-12 else "inconclusive"


def equivalent(ci_lo: float | None, ci_hi: float | None, tolerance: float) -> bool | None:
    """Whether a ratio's 95% CI ``[ci_lo, ci_hi]`` shows the two equal within ``tolerance``: the whole
    interval inside ``[1 - tolerance, 1 + tolerance]`` (equivalence by two one-sided tests at 2.5% each).
    Unlike :func:`verdict`'s ``agree``, a difference the repeats resolve can still be within ``tolerance``
    (1.010 [1.002, 1.018] at 2%), and an interval that reaches past a bound is not. ``None`` without an
    interval."""
    if ci_lo is None or ci_hi is None:
        return None
    return 1.0 - tolerance - 1e-12 <= ci_lo and ci_hi <= 1.0 + tolerance + 1e-12


def beyond(ci_lo: float | None, ci_hi: float | None, tolerance: float) -> bool | None:
    """Whether a ratio's 95% CI ``[ci_lo, ci_hi]`` shows a difference larger than ``tolerance``: the whole
    interval above ``1 + tolerance`` or below ``1 - tolerance`` (the mirror of :func:`equivalent`'s test: an
    interval can be neither).
    ``None`` without an interval."""
    if ci_lo is None or ci_hi is None:
        return None
    return ci_lo > 1.0 + tolerance + 1e-12 or ci_hi < 1.0 - tolerance - 1e-12
