"""The paper's directional claims that a study can measure, each judged from the tracked runs.

One row per claim: the numbers behind it, how many seeds (or runs) they rest on and their spread, and
a verdict:

    holds            the measured direction is the paper's, beyond the noise
    does not hold    the opposite direction, beyond the noise
    within noise     the difference is inside the noise: for fine-tuning, the seeds' [min, max] of the
                     two sides overlap on every task compared; for a curve, the change is within two
                     standard deviations of the values around its end; for two single numbers,
                     |difference| < SINGLE_VALUE_TOLERANCE
    not measured     the runs it needs are not in the study (the row says which)

Thresholds the paper leaves implicit are stated in the claim's text. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from jobs.runs import with_fractions

HOLDS, FAILS, NOISE = "holds", "does not hold", "within noise"
SINGLE_VALUE_TOLERANCE = 0.005
HIGH_COPY_ACCURACY, HIGH_POSITIVE_COSINE, NEAR_ZERO = 0.9, 0.8, 0.2
TAIL = 0.2  # the last fifth of a curve is "its end"; the first fifth its start
TABLE3_ABLATIONS = ("rtd_only", "clm_only", "scl_rtd", "no_rel_pos", "electra_aux", "random_replace",
                    "converged_aux", "all_token_lm", "clm_no_copy", "clm_no_stopgrad")


@dataclass(frozen=True)
class Claim:
    source: str  # where the paper makes it
    statement: str
    numbers: str
    basis: str  # seeds or runs, and their spread
    verdict: str


def not_measured(source: str, statement: str, why: str) -> Claim:
    return Claim(source, statement, "-", "-", f"not measured: {why}")


# ----------------------------------------------------------------------------- pretraining signals


def curve_claim(source: str, statement: str, hist: pd.DataFrame, run_id: str, key: str, label: str) -> Claim:
    """`key` rises over the run: the mean of its last fifth against the mean of its first fifth."""
    values = hist[(hist["run_id"] == run_id) & (hist["key"] == key)].sort_values("step")["value"].to_numpy()
    if len(values) < 2:
        return not_measured(source, statement, f"{label} logged fewer than two values of {key}")
    n = max(1, int(round(TAIL * len(values))))
    start, end = values[:n].mean(), values[-n:].mean()
    noise = 2 * values[-n:].std() if n > 1 else 0.0
    change = end - start
    verdict = NOISE if abs(change) <= noise else (HOLDS if change > 0 else FAILS)
    return Claim(source, statement, f"{label}: {key} {start:.3f} -> {end:.3f}",
                 f"1 run, {len(values)} logged values; noise 2 sd of the end = {noise:.3f}", verdict)


def level_claim(source: str, statement: str, value: float | None, label: str, key: str, holds) -> Claim:
    if value is None or np.isnan(value):
        return not_measured(source, statement, f"{label} has no {key}")
    return Claim(source, statement, f"{label}: {key} {value:.3f}", "1 run (last logged value)",
                 HOLDS if holds(value) else FAILS)


def compare_values(source: str, statement: str, lower: tuple[str, float | None], higher: tuple[str, float | None],
                   key: str) -> Claim:
    """`lower`'s value is below `higher`'s (each one run's last value)."""
    (low_label, low), (high_label, high) = lower, higher
    missing = [label for label, v in (lower, higher) if v is None or np.isnan(v)]
    if missing:
        return not_measured(source, statement, f"no {key} for {', '.join(missing)}")
    diff = high - low
    verdict = NOISE if abs(diff) < SINGLE_VALUE_TOLERANCE else (HOLDS if diff > 0 else FAILS)
    return Claim(source, statement, f"{key}: {low_label} {low:.3f}, {high_label} {high:.3f}",
                 f"1 run each (tolerance {SINGLE_VALUE_TOLERANCE})", verdict)


# ----------------------------------------------------------------------------- fine-tuning


def compare_finetuning(source: str, statement: str, better: str, worse: str, scores: pd.DataFrame,
                       runs: pd.DataFrame) -> Claim:
    """`better`'s fine-tuning medians are at least `worse`'s on the tasks both were fine-tuned on."""
    ids = dict(zip(runs["variant"], runs["run_id"]))
    absent = [v for v in (better, worse) if v not in ids]
    if absent:
        return not_measured(source, statement, f"no {' or '.join(absent)} pretraining run in the study")
    a, b = (scores[scores["pretraining_run"] == ids[v]].set_index("task") for v in (better, worse))
    tasks = sorted(set(a.index) & set(b.index))
    if not tasks:
        return not_measured(source, statement, f"{better} and {worse} share no fine-tuned task")
    diff = float(np.mean([a.loc[t, "score"] - b.loc[t, "score"] for t in tasks]))
    overlap = all(a.loc[t, "min"] <= b.loc[t, "max"] and b.loc[t, "min"] <= a.loc[t, "max"] for t in tasks)
    verdict = NOISE if overlap else (HOLDS if diff >= 0 else FAILS)
    numbers = "; ".join(f"{t} {100 * a.loc[t, 'score']:.2f} vs {100 * b.loc[t, 'score']:.2f}" for t in tasks)
    seeds = sorted({int(s) for s in pd.concat([a.loc[tasks, "seeds"], b.loc[tasks, "seeds"]]) if s == s})
    spread = "; ".join(f"{t} [{100 * a.loc[t, 'min']:.1f}, {100 * a.loc[t, 'max']:.1f}] vs "
                       f"[{100 * b.loc[t, 'min']:.1f}, {100 * b.loc[t, 'max']:.1f}]" for t in tasks)
    return Claim(source, statement, f"{better} vs {worse} (median x100): {numbers}",
                 f"{'/'.join(map(str, seeds)) or '?'} seeds; min-max {spread}", verdict)


def scl_gain_claim(scores: pd.DataFrame, runs: pd.DataFrame, with_scl: str = "cocolm",
                   without_scl: str = "clm_only") -> Claim:
    """Fig. 7c/d: the gain of SCL (`with_scl` - `without_scl`, fine-tuning medians) is larger at the smallest
    label fraction both were fine-tuned on than at the largest, per task and then on average. Within noise
    when that change is at most half the mean min-max spread over seeds of the four points it rests on."""
    statement = f"the SCL gain ({with_scl} - {without_scl}) grows as labels shrink"
    ids = dict(zip(runs["variant"], runs["run_id"]))
    absent = [v for v in (with_scl, without_scl) if v not in ids]
    if absent:
        return not_measured("Fig. 7c/d", statement, f"no {' or '.join(absent)} pretraining run in the study")
    points = with_fractions(scores)
    a, b = (points[points["pretraining_run"] == ids[v]].set_index(["base", "fraction"]) for v in (with_scl, without_scl))
    shared = sorted(set(a.index) & set(b.index))
    tasks = sorted({t for t, _ in shared if len([f for u, f in shared if u == t]) >= 2})
    if not tasks:
        return not_measured("Fig. 7c/d", statement, f"{with_scl} and {without_scl} share no task fine-tuned on two "
                            f"or more label fractions (--label-fractions)")
    changes, spreads, numbers = [], [], []
    for task in tasks:
        low, high = (f(f_ for t, f_ in shared if t == task) for f in (min, max))
        gain = {f: a.loc[(task, f), "score"] - b.loc[(task, f), "score"] for f in (low, high)}
        changes.append(gain[low] - gain[high])
        spreads += [(side.loc[(task, f), "max"] - side.loc[(task, f), "min"]) / 2 for side in (a, b) for f in (low, high)]
        numbers.append(f"{task}: {100 * gain[low]:+.2f} at {low:g} of the labels, {100 * gain[high]:+.2f} at {high:g}")
    change, noise = float(np.mean(changes)), float(np.nanmean(spreads))
    verdict = NOISE if abs(change) <= noise else (HOLDS if change > 0 else FAILS)
    seeds = sorted({int(s) for s in pd.concat([a["seeds"], b["seeds"]]) if s == s})
    return Claim("Fig. 7c/d", statement, "; ".join(numbers) + " (x100)",
                 f"{'/'.join(map(str, seeds)) or '?'} seeds per point; change {100 * change:+.2f} vs noise "
                 f"{100 * noise:.2f} (half the mean min-max spread)", verdict)


def equal_steps(runs: pd.DataFrame, variants: tuple[str, ...]) -> bool:
    present = runs[runs["variant"].isin(variants)]
    steps = present.get("params.train.max_steps", pd.Series(dtype=object)).dropna().unique()
    return len(steps) <= 1


# ----------------------------------------------------------------------------- all claims


def judge(runs: pd.DataFrame, hist: pd.DataFrame, scores: pd.DataFrame) -> list[Claim]:
    """Every claim, from the study's pretraining runs (one per variant: `latest_per_variant`), their
    metric histories and the fine-tuning scores (`sweep_scores`, with min, max and seeds). Tables 1 and 3
    compare the scores on all the labels; Fig. 7c/d reads the label fractions."""
    by_variant = {row["variant"]: row for _, row in runs.iterrows()}
    all_scores, scores = scores, scores[with_fractions(scores)["fraction"] >= 1]

    def last(variant: str, key: str) -> float | None:
        row = by_variant.get(variant)
        return None if row is None else row.get(f"metrics.{key}", np.nan)

    claims = [
        compare_values("Fig. 1/5", "random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA",
                       ("cocolm", last("cocolm", "represent/random_cosine_mean")),
                       ("electra", last("electra", "represent/random_cosine_mean")), "represent/random_cosine_mean"),
        level_claim("Fig. 1/5", "similar pairs score above random pairs (COCO-LM: cosine gap > 0)",
                    last("cocolm", "represent/cosine_gap"), "cocolm", "represent/cosine_gap", lambda v: v > 0),
    ]
    cocolm = by_variant.get("cocolm")
    if cocolm is None:
        claims += [not_measured("Fig. 8", s, "no cocolm pretraining run in the study") for s in (
            "copy accuracy on original tokens is high", "copy accuracy on replaced tokens rises",
            "LM accuracy on replaced tokens rises")]
    else:
        run_id = cocolm["run_id"]
        claims += [
            level_claim("Fig. 8", f"copy accuracy on original tokens is high (>= {HIGH_COPY_ACCURACY})",
                        last("cocolm", "copy_accuracy_original"), "cocolm", "copy_accuracy_original",
                        lambda v: v >= HIGH_COPY_ACCURACY),
            curve_claim("Fig. 8", "copy accuracy on replaced tokens rises during pretraining", hist, run_id,
                        "copy_accuracy_replaced", "cocolm"),
            curve_claim("Fig. 8", "LM accuracy on replaced tokens rises during pretraining", hist, run_id,
                        "lm_accuracy_replaced", "cocolm"),
        ]
    claims += [
        level_claim("Fig. 7a", f"SCL positive-pair cosine is high (>= {HIGH_POSITIVE_COSINE})",
                    last("cocolm", "scl_positive_cosine"), "cocolm", "scl_positive_cosine",
                    lambda v: v >= HIGH_POSITIVE_COSINE),
        level_claim("Fig. 7b", f"SCL negative-pair cosine is near 0 (|cos| <= {NEAR_ZERO})",
                    last("cocolm", "scl_negative_cosine"), "cocolm", "scl_negative_cosine",
                    lambda v: abs(v) <= NEAR_ZERO),
    ]
    ablations = [v for v in TABLE3_ABLATIONS if v in by_variant]
    if not ablations:
        claims.append(not_measured("Table 3", "COCO-LM is at least each ablation (fine-tuning median)",
                                   "no Table 3 ablation in the study"))
    for ablation in ablations:
        claims.append(compare_finetuning("Table 3", f"COCO-LM is at least {ablation} (fine-tuning median)",
                                         "cocolm", ablation, scores, runs))
    order = ("cocolm", "electra", "roberta_mlm")
    statement = "at equal pretraining steps: COCO-LM above ELECTRA above RoBERTa (fine-tuning median)"
    if not equal_steps(runs, order):
        claims.append(not_measured("Table 1", statement, "the three were pretrained for different steps"))
    else:
        claims += [compare_finetuning("Table 1", f"{statement}: {a} >= {b}", a, b, scores, runs)
                   for a, b in zip(order, order[1:])]
    return [*claims, scl_gain_claim(all_scores, runs)]


def claims_markdown(claims: list[Claim]) -> str:
    lines = ["Paper claims, judged from this study's runs (see analysis/claims.py for the rules)\n",
             "| source | claim | numbers | seeds / runs | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {c.source} | {c.statement} | {c.numbers} | {c.basis} | **{c.verdict}** |" for c in claims]
    return "\n".join(lines) + "\n"
