"""Paired statistics of the reproduction: the difference of two rows per seed (same stage-1 start, same seed =
same data order and head initialisation), its mean, the 95% Student-t interval and the two-sided p value.

The t distribution is computed here (no scipy): its CDF through the regularised incomplete beta function
(continued fraction, Lentz's method), its quantile by bisection on the CDF.
"""
from __future__ import annotations

import math
import statistics

from winpos.errors import WinposError


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection to 1e-12)."""
    if not 0 < q < 1:
        raise WinposError(f"quantile {q!r} must be in (0, 1)")
    lo, hi = -1e4, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def paired(treatment: dict, baseline: dict, level: float = 0.95) -> dict:
    """Paired comparison of two rows given as ``{seed: value}``; only seeds present in both count.

    Returns ``n``, ``per_seed`` (treatment - baseline, by seed), ``mean``, ``sd``, the ``level`` t-interval
    ``ci`` (None for n < 2), the two-sided ``p`` of mean = 0 (None for n < 2; 0 when every difference is the same
    non-zero value) and ``excludes_zero``."""
    seeds = sorted(set(treatment) & set(baseline))
    diffs = [treatment[s] - baseline[s] for s in seeds]
    out = {"n": len(diffs), "seeds": seeds, "per_seed": diffs, "mean": statistics.fmean(diffs) if diffs else None,
           "sd": None, "ci": None, "p": None, "excludes_zero": None, "level": level}
    if len(diffs) < 2:
        return out
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    df = len(diffs) - 1
    se = sd / math.sqrt(len(diffs))
    half = t_quantile(0.5 + level / 2, df) * se
    if se == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = 2.0 * (1.0 - t_cdf(abs(mean) / se, df))
    out.update(sd=sd, ci=(mean - half, mean + half), p=p, excludes_zero=(mean - half > 0 or mean + half < 0))
    return out


def describe(result: dict, unit: str = "AP") -> str:
    """``+0.52 [-0.15, +1.18] p=0.08 (n=3)``, or the one value and ``n=1: no interval``."""
    if result["n"] == 0:
        return "no paired seeds"
    if result["ci"] is None:
        return f"{result['mean']:+.2f} {unit} (n=1: no interval)"
    lo, hi = result["ci"]
    return f"{result['mean']:+.2f} [{lo:+.2f}, {hi:+.2f}] p={result['p']:.3f} (n={result['n']})"
