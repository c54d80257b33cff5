"""Statistics of the reproduction: paired differences of two rows per seed (same stage-1 start, same seed = same
data order and head initialisation), their mean, the 95% Student-t interval and the two-sided p value; for the
equal-footing study, means over pipelines, one-sample t tests with a non-inferiority margin, the exact sign-flip
p, Holm's adjustment and the power of a paired test.

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


def _t_interval(values: list, level: float) -> tuple[float, float, float, float]:
    """mean, sd, standard error and the half-width of the two-sided ``level`` t-interval (n >= 2)."""
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    se = sd / math.sqrt(len(values))
    return mean, sd, se, t_quantile(0.5 + level / 2, len(values) - 1) * se


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
    mean, sd, se, half = _t_interval(diffs, level)
    if se == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = 2.0 * (1.0 - t_cdf(abs(mean) / se, len(diffs) - 1))
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


def format_ci(res: dict) -> str:
    """``+0.52 [-0.15, +1.18]`` of a ``t_test`` result, or its mean and ``(n=1: no interval)``."""
    if res.get("ci") is None:
        return f"{res['mean']:+.2f} (n={res['n']}: no interval)"
    lo, hi = res["ci"]
    return f"{res['mean']:+.2f} [{lo:+.2f}, {hi:+.2f}]"


# ------------------------------------------------- over independent pipelines (the equal-footing study)
def mean_interval(values: list, level: float = 0.95) -> dict:
    """Mean, sd and the ``level`` Student-t interval of ``values`` (over pipelines)."""
    n = len(values)
    out = {"n": n, "mean": statistics.fmean(values) if values else None, "sd": None, "ci": None}
    if n >= 2:
        mean, sd, _, half = _t_interval(values, level)
        out.update(sd=sd, ci=(mean - half, mean + half))
    return out


def sign_flip_p(diffs: list, alternative: str = "two-sided") -> float:
    """Exact sign-flip (randomisation) p of mean(diffs) = 0 against ``alternative`` ("two-sided" or "greater"):
    the share of the 2^n sign patterns whose mean is at least as extreme. Its smallest value is 2 / 2^n
    (two-sided) or 1 / 2^n. Exact for n up to 40: the sums of the two halves' sign patterns are enumerated apart
    (2^(n/2) each) and paired by bisection on the sorted second half (meet in the middle), not 2^n sums."""
    import bisect

    n = len(diffs)
    if n == 0:
        raise WinposError("sign_flip_p needs at least one difference")
    if n > 40:
        raise WinposError(f"sign_flip_p enumerates 2^(n/2) patterns per half; n={n} is too many (use at most 40)")
    if alternative not in ("two-sided", "greater"):
        raise WinposError(f"alternative {alternative!r} must be 'two-sided' or 'greater'")
    obs = sum(diffs)
    tol = 1e-12 * max(1.0, sum(abs(d) for d in diffs))

    def sums(values):
        out = [0.0]
        for v in values:
            out = [x + v for x in out] + [x - v for x in out]
        return out

    left, right = sums(diffs[: n // 2]), sorted(sums(diffs[n // 2:]))
    hits = 0
    for a in left:  # patterns with a + b >= threshold (and, two-sided, a + b <= -threshold)
        if alternative == "two-sided":
            edge = abs(obs) - tol
            hits += len(right) - bisect.bisect_left(right, edge - a)
            hits += bisect.bisect_right(right, -edge - a) if edge > 0 else 0
        else:
            hits += len(right) - bisect.bisect_left(right, obs - tol - a)
    return min(hits, 2 ** n) / 2 ** n


def t_test(diffs: list, shift: float = 0.0, alternative: str = "two-sided", level: float = 0.95) -> dict:
    """One-sample t test of mean(diffs) = -``shift`` (``shift`` = the non-inferiority margin, 0 for a plain test)
    with the two-sided ``level`` interval of the mean, and the exact sign-flip p of ``diffs + shift`` beside it."""
    n = len(diffs)
    res = {"n": n, "diffs": list(diffs), "mean": statistics.fmean(diffs) if diffs else None, "ci": None,
           "p_t": None, "p_sign_flip": None, "alternative": alternative, "margin": shift}
    if n < 2:
        return res
    mean, sd, se, half = _t_interval(diffs, level)
    res.update(sd=sd, ci=(mean - half, mean + half))
    shifted = [d + shift for d in diffs]
    m = statistics.fmean(shifted)
    if se == 0:
        p = 0.0 if m != 0 and (alternative == "two-sided" or m > 0) else 1.0
    else:
        t = m / se
        p = 2 * (1 - t_cdf(abs(t), n - 1)) if alternative == "two-sided" else 1 - t_cdf(t, n - 1)
    res.update(p_t=p, p_sign_flip=sign_flip_p(shifted, alternative))
    return res


def tost(diffs: list, margin: float, alpha: float = 0.05) -> dict:
    """Two one-sided t tests (TOST) of equivalence within +-``margin``: ``p_lower`` of H0 mean <= -margin and
    ``p_upper`` of H0 mean >= +margin, each one-sided with n - 1 degrees of freedom; ``p`` = the larger of the two
    (equivalence is shown at level ``alpha`` when ``p`` < ``alpha``, which is when the two-sided 1 - 2 ``alpha``
    interval ``ci`` lies inside +-``margin``)."""
    if not margin > 0:
        raise WinposError(f"the equivalence margin {margin!r} must be > 0")
    n = len(diffs)
    out = {"n": n, "margin": margin, "alpha": alpha, "p_lower": None, "p_upper": None, "p": None, "ci": None}
    if n < 2:
        return out
    mean, _, se, half = _t_interval(diffs, 1 - 2 * alpha)
    if se == 0:
        lower, upper = float(mean <= -margin), float(mean >= margin)
    else:
        lower = 1 - t_cdf((mean + margin) / se, n - 1)
        upper = t_cdf((mean - margin) / se, n - 1)
    out.update(p_lower=lower, p_upper=upper, p=max(lower, upper), ci=(mean - half, mean + half))
    return out


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjustment of ``{name: p}``; a test with p None (not run) counts in the family as p = 1,
    so the adjustment of the others stays valid while it is missing."""
    items = sorted(pvalues.items(), key=lambda kv: 1.0 if kv[1] is None else kv[1])
    m, running, out = len(items), 0.0, {}
    for i, (name, p) in enumerate(items):
        running = max(running, min(1.0, (m - i) * (1.0 if p is None else p)))
        out[name] = None if p is None else running
    return out


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _over_chi(df: int, fn, points: int = 2000) -> float:
    """E[fn(U)] for U chi-distributed with ``df`` degrees of freedom (the sample sd is sd U / sqrt(df)), by
    Simpson's rule over U's density on its mode +- 12."""
    log_norm = math.log(2.0) - (df / 2) * math.log(2.0) - math.lgamma(df / 2)  # chi density's constant
    lo = max(0.0, math.sqrt(max(df - 1, 0)) - 12.0)
    step = (math.sqrt(max(df - 1, 0)) + 12.0 - lo) / points
    total = 0.0
    for i in range(points + 1):
        u = lo + i * step
        if u > 0:
            density = math.exp(log_norm + (df - 1) * math.log(u) - u * u / 2)
        else:  # the density at 0 is 0 unless df = 1
            density = math.exp(log_norm) if df == 1 else 0.0
        weight = 1 if i in (0, points) else (4 if i % 2 else 2)
        total += weight * density * fn(u)
    return total * step / 3


def power_paired(effect: float, sd: float, n: int, alpha: float = 0.05, points: int = 2000) -> float:
    """Power of a two-sided one-sample t test at level ``alpha`` with ``n`` values whose true mean is ``effect`` and
    standard deviation ``sd``: P(|T| > t_crit) for T noncentral t with n - 1 degrees of freedom and noncentrality
    effect * sqrt(n) / sd. Exact up to the quadrature: T = (Z + delta) / (U / sqrt(df)) with U chi-distributed, so
    the power is the expectation over U of Phi(delta - c U / sqrt(df)) + Phi(-delta - c U / sqrt(df)) (``_over_chi``).
    At effect 0 it is ``alpha``. (The normal approximation with the t critical value, which it replaces, gave about 0
    instead of 0.05 at n = 3.)"""
    if sd <= 0 or n < 2:
        return float("nan")
    df = n - 1
    crit = t_quantile(1 - alpha / 2, df)
    delta = abs(effect) * math.sqrt(n) / sd

    def rejected(u):
        s = crit * u / math.sqrt(df)
        return _normal_cdf(delta - s) + _normal_cdf(-delta - s)

    return min(1.0, _over_chi(df, rejected, points))


def power_tost(true_diff: float, sd: float, n: int, margin: float, alpha: float = 0.05, points: int = 2000) -> float:
    """Power of TOST (``tost``) at level ``alpha`` with ``n`` values of true mean ``true_diff`` and standard deviation
    ``sd``: the probability that -margin + c s / sqrt(n) < mean < margin - c s / sqrt(n), with c the one-sided
    1 - ``alpha`` t quantile and s the sample sd. With s = sd U / sqrt(df) (U chi-distributed) and the mean normal,
    the expectation over U (``_over_chi``) of the normal probability of that window (0 where it is empty)."""
    if sd <= 0 or n < 2:
        return float("nan")
    df = n - 1
    crit = t_quantile(1 - alpha, df)
    root = math.sqrt(n)

    def inside(u):
        width = margin - crit * sd * u / math.sqrt(df) / root  # the mean must lie within +-width
        if width <= 0:
            return 0.0
        return _normal_cdf((width - true_diff) * root / sd) - _normal_cdf((-width - true_diff) * root / sd)

    return min(1.0, _over_chi(df, inside, points))


def n_for_power(effect: float, sd: float, target: float = 0.8, alpha: float = 0.05) -> int | None:
    """The smallest n (2-499) at which :func:`power_paired` reaches ``target``; None when none does."""
    for n in range(2, 500):
        if power_paired(effect, sd, n, alpha) >= target:
            return n
    return None
