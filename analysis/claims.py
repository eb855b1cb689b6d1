"""The paper's claims that a study can measure, each judged from the tracked runs by a stated test.

One row per claim (per task where the claim is about fine-tuning): the numbers, what they rest on,
and a verdict:

    holds             the paper's direction, and the 95% interval of the difference excludes 0
    does not hold     the opposite direction, and the interval excludes 0
    within noise      the interval contains 0
    not enough seeds  a side has fewer than MIN_SEEDS seeds (few-shot: splits); the paper's protocol is 5
    not comparable    the runs were pretrained with different presets or budgets (steps, batch, length)
    not measured      the study lacks the runs it needs (the row says which)

The test is a percentile bootstrap (`scipy.stats.bootstrap`, RESAMPLES resamples, a fixed seed) of the
difference of medians, each side resampled on its own. Its samples are, for fine-tuning, the seeds
at each side's best grid point; for few-shot, the splits; for the [CLS] cosines of
`jobs.studies.represent`, the sentence pairs; for pretraining signals (one run per variant), the
logged interval means over the last fifth of each curve, so their noise is the curve's own wobble
and not a new pretraining seed (the basis column says so).

Where the paper's claim is about certain tasks it is judged on those (relative positions: MNLI; SCL:
RTE and MRPC). Every other fine-tuning comparison gets a line per task and, with several tasks, a
summary line that names every task going the other way. Scores of different tasks (accuracy,
Matthews correlation, F1) are never averaged. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from jobs.runs import BUDGET_PARAMS, with_fractions

HOLDS, FAILS, NOISE = "holds", "does not hold", "within noise"
FEW_SEEDS, NOT_COMPARABLE = "not enough seeds", "not comparable"
MIN_SEEDS = 3
CONFIDENCE, RESAMPLES, BOOTSTRAP_SEED = 0.95, 9999, 0
TAIL = 0.2  # the last fifth of a curve is "its end"; the first fifth its start
DEFAULT_CROP = "cocolm"  # the paper's crop fraction (0.9) is cocolm's own
TABLE3_ABLATIONS = ("rtd_only", "clm_only", "scl_rtd", "electra_aux", "random_replace", "converged_aux",
                    "all_token_lm", "cocolm_no_copy")
CLM_SETUP = ("clm_no_copy",)  # Table 3's "CLM Setup" rows, ablations of clm_only (model/variants.py)


@dataclass(frozen=True)
class Claim:
    source: str  # where the paper makes it
    statement: str
    numbers: str
    basis: str  # what the test rests on: seeds, splits, pairs or logged values, and the interval
    verdict: str


def not_measured(source: str, statement: str, why: str) -> Claim:
    """A claim that could not be judged: `why` is a reason, or already a verdict (`Study.row`'s
    "not comparable: ..." or "not measured: ...")."""
    verdict = why if why.startswith((NOT_COMPARABLE, "not measured")) else f"not measured: {why}"
    return Claim(source, statement, "-", "-", verdict)


# ----------------------------------------------------------------------------- the test


@dataclass(frozen=True)
class Difference:
    """A statistic of two or more samples (higher is the paper's direction) and its 95% interval."""

    value: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        return HOLDS if self.low > 0 else FAILS if self.high < 0 else NOISE

    def text(self, scale: float = 1.0, digits: int = 2) -> str:
        return f"{scale * self.value:+.{digits}f} [{scale * self.low:+.{digits}f}, {scale * self.high:+.{digits}f}]"


def bootstrap(samples: Sequence[Sequence[float]], statistic: Callable[..., np.ndarray]) -> Difference:
    """`statistic(*samples, axis=-1)` and its 95% percentile bootstrap interval, each sample resampled on its own."""
    arrays = tuple(np.asarray(s, dtype=float) for s in samples)
    value = float(statistic(*arrays, axis=-1))
    if all(np.ptp(a) == 0 for a in arrays):  # no spread anywhere: every resample gives the value itself
        return Difference(value, value, value)
    result = stats.bootstrap(arrays, statistic, n_resamples=RESAMPLES, vectorized=True, paired=False,
                             confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(BOOTSTRAP_SEED))
    return Difference(value, float(result.confidence_interval.low), float(result.confidence_interval.high))


def median_difference(higher: Sequence[float], lower: Sequence[float]) -> Difference:
    """median(higher) - median(lower), with its interval."""
    return bootstrap((higher, lower), lambda h, l, axis: np.median(h, axis=axis) - np.median(l, axis=axis))


def summary_verdict(verdicts: dict[str, str]) -> str:
    """One verdict over tasks that never hides one: the shared verdict, or each verdict with its tasks."""
    if len(set(verdicts.values())) == 1:
        return next(iter(verdicts.values()))
    groups: dict[str, list[str]] = {}
    for task, verdict in verdicts.items():
        groups.setdefault(verdict, []).append(task)
    return "mixed: " + "; ".join(f"{verdict} on {', '.join(tasks)}" for verdict, tasks in groups.items())


# ----------------------------------------------------------------------------- the study's runs


@dataclass(frozen=True)
class Study:
    """The runs of one preset (`runs`: one per variant) with everything the claims read."""

    preset: str
    runs: pd.DataFrame
    other_presets: pd.DataFrame  # the study's runs of every other preset: named when a variant is only there
    hist: pd.DataFrame
    scores: pd.DataFrame  # sweep_scores on all the labels
    fraction_scores: pd.DataFrame  # sweep_scores with the label fractions
    fewshot: pd.DataFrame
    pairs: dict[str, pd.DataFrame]  # run_id -> jobs.studies.represent's per-pair cosines

    def row(self, variant: str) -> pd.Series | str:
        """The variant's run, or why there is none to compare (a verdict)."""
        mine = self.runs[self.runs["variant"] == variant]
        if len(mine):
            return mine.iloc[-1]
        elsewhere = sorted(set(self.other_presets.loc[self.other_presets["variant"] == variant, "preset"]))
        if elsewhere:
            return (f"{NOT_COMPARABLE}: {variant} was pretrained with preset {', '.join(elsewhere)}, "
                    f"not {self.preset}")
        return f"not measured: no {variant} pretraining run in the study"

    def pair(self, *variants: str) -> list[pd.Series] | str:
        """The variants' runs when they can be compared (one preset, one budget), else why not."""
        rows = [self.row(v) for v in variants]
        for found in rows:
            if isinstance(found, str):
                return found
        budgets = {row["variant"]: tuple(row.get(f"params.{p}") for p in BUDGET_PARAMS) for row in rows}
        if len(set(budgets.values())) > 1:
            return (f"{NOT_COMPARABLE}: different pretraining budgets (" + "; ".join(
                f"{v}: {b[0]} steps of {b[1]} x {b[2]} tokens" for v, b in budgets.items()) + ")")
        return rows

    def curve(self, run_id: str, key: str) -> np.ndarray:
        values = self.hist[(self.hist["run_id"] == run_id) & (self.hist["key"] == key)]
        return values.sort_values("step")["value"].to_numpy()


# ----------------------------------------------------------------------------- fine-tuning


def finetuning_claims(study: Study, source: str, statement: str, better: str, worse: str,
                      tasks: Sequence[str] | None = None, scores: pd.DataFrame | None = None) -> list[Claim]:
    """`better`'s fine-tuning scores are above `worse`'s: a line per task (only `tasks` when the paper's claim
    is about those), and a summary line when there are several."""
    rows = study.pair(better, worse)
    if isinstance(rows, str):
        return [not_measured(source, statement, rows)]
    scores = study.scores if scores is None else scores
    a, b = (scores[scores["pretraining_run"] == r["run_id"]].set_index("task") for r in rows)
    shared = [t for t in sorted(set(a.index) & set(b.index)) if tasks is None or t in tasks]
    if not shared:
        wanted = f" on {', '.join(tasks)}" if tasks else ""
        return [not_measured(source, statement, f"{better} and {worse} share no fine-tuned task{wanted}")]
    claims = [seed_claim(source, f"{statement}: {task}", (better, a.loc[task, "values"]), (worse, b.loc[task, "values"]),
                         "seeds") for task in shared]
    if len(claims) > 1:
        verdicts = dict(zip(shared, (c.verdict for c in claims)))
        claims.append(Claim(source, f"{statement}: all {len(shared)} tasks", "per task above, never averaged",
                            "the task lines", summary_verdict(verdicts)))
    return claims


def seed_claim(source: str, statement: str, better: tuple[str, Sequence[float]], worse: tuple[str, Sequence[float]],
               unit: str) -> Claim:
    """Two sides' per-seed (or per-split) scores, x100: at least MIN_SEEDS each, then the bootstrap."""
    (a_name, a), (b_name, b) = better, worse
    a, b = list(a if isinstance(a, tuple) else ()), list(b if isinstance(b, tuple) else ())
    medians = " vs ".join(f"{name} {100 * np.median(v):.2f}" if v else f"{name} -" for name, v in ((a_name, a), (b_name, b)))
    if min(len(a), len(b)) < MIN_SEEDS:
        return Claim(source, statement, f"median x100: {medians}",
                     f"{len(a)} vs {len(b)} {unit} (at least {MIN_SEEDS} each)", FEW_SEEDS)
    difference = median_difference(a, b)
    return Claim(source, statement, f"median x100: {medians}; difference {difference.text(100)}",
                 f"{len(a)} vs {len(b)} {unit}; 95% bootstrap interval of the median difference", difference.verdict)


def scl_gain_claim(study: Study, with_scl: str = "cocolm", without_scl: str = "clm_only") -> list[Claim]:
    """Fig. 7c/d: the SCL gain (`with_scl` - `without_scl`, medians over seeds) is larger at the smallest label
    fraction both were fine-tuned on than at the largest, per task: the interval of that change of gains."""
    statement = f"the SCL gain ({with_scl} - {without_scl}) grows as labels shrink"
    rows = study.pair(with_scl, without_scl)
    if isinstance(rows, str):
        return [not_measured("Fig. 7c/d", statement, rows)]
    points = with_fractions(study.fraction_scores)
    a, b = (points[points["pretraining_run"] == r["run_id"]].set_index(["base", "fraction"]) for r in rows)
    shared = sorted(set(a.index) & set(b.index))
    tasks = sorted({t for t, _ in shared if len([f for u, f in shared if u == t]) >= 2})
    if not tasks:
        return [not_measured("Fig. 7c/d", statement, f"{with_scl} and {without_scl} share no task fine-tuned on two "
                             f"or more label fractions (--label-fractions)")]
    claims = []
    for task in tasks:
        low, high = (f(f_ for t, f_ in shared if t == task) for f in (min, max))
        samples = [list(side.loc[(task, f), "values"]) for f in (low, high) for side in (a, b)]
        label = f"{statement}: {task}, {low:g} vs {high:g} of the labels"
        if min(map(len, samples)) < MIN_SEEDS:
            claims.append(Claim("Fig. 7c/d", label, "-", f"{'/'.join(str(len(s)) for s in samples)} seeds "
                                f"(at least {MIN_SEEDS} each)", FEW_SEEDS))
            continue
        change = bootstrap(samples, lambda al, bl, ah, bh, axis: (np.median(al, axis=axis) - np.median(bl, axis=axis))
                           - (np.median(ah, axis=axis) - np.median(bh, axis=axis)))
        gains = [np.median(samples[0]) - np.median(samples[1]), np.median(samples[2]) - np.median(samples[3])]
        claims.append(Claim("Fig. 7c/d", label, f"gain x100 {100 * gains[0]:+.2f} at {low:g}, {100 * gains[1]:+.2f} at "
                            f"{high:g}; change {change.text(100)}",
                            f"{min(map(len, samples))}+ seeds per point; 95% bootstrap interval of the change",
                            change.verdict))
    return claims


# ----------------------------------------------------------------------------- pretraining signals


def ends(values: np.ndarray, first: bool = False) -> np.ndarray:
    """The last (or first) fifth of a curve's logged values, at least two of them."""
    n = max(2, int(round(TAIL * len(values))))
    return values[:n] if first else values[-n:]


def signal_claim(study: Study, source: str, statement: str, higher: tuple[str, str], lower: tuple[str, str]) -> Claim:
    """(variant, key) `higher`'s curve ends above `lower`'s: the medians of their last fifths, with the interval
    over those logged values."""
    rows = study.pair(*dict.fromkeys((higher[0], lower[0])))
    if isinstance(rows, str):
        return not_measured(source, statement, rows)
    by_variant = {r["variant"]: r for r in rows}
    curves = [study.curve(by_variant[v]["run_id"], key) for v, key in (higher, lower)]
    short = [f"{v} {key}" for (v, key), c in zip((higher, lower), curves) if len(c) < 4]
    if short:
        return not_measured(source, statement, f"fewer than 4 logged values of {', '.join(short)}")
    a, b = ends(curves[0]), ends(curves[1])
    difference = median_difference(a, b)
    names = [f"{v} {key}" for v, key in (higher, lower)]
    return Claim(source, statement, f"end of run: {names[0]} {np.median(a):.3f}, {names[1]} {np.median(b):.3f}; "
                 f"difference {difference.text(digits=3)}",
                 f"1 run each; {len(a)} vs {len(b)} logged values (last fifth); 95% bootstrap interval", difference.verdict)


def rise_claim(study: Study, source: str, statement: str, variant: str, key: str) -> Claim:
    """`key` rises over the variant's run: the last fifth of its curve against the first fifth."""
    row = study.row(variant)
    if isinstance(row, str):
        return not_measured(source, statement, row)
    values = study.curve(row["run_id"], key)
    if len(values) < 4:
        return not_measured(source, statement, f"{variant} logged fewer than 4 values of {key}")
    start, end = ends(values, first=True), ends(values)
    difference = median_difference(end, start)
    return Claim(source, statement, f"{variant}: {key} {np.median(start):.3f} -> {np.median(end):.3f}; "
                 f"difference {difference.text(digits=3)}",
                 f"1 run; first vs last fifth, {len(start)} logged values each; 95% bootstrap interval", difference.verdict)


def stability_claim(study: Study, unstable: str = "clm_no_stopgrad", stable: str = "clm_only") -> Claim:
    """Table 3's stop-gradient row is about stability: `unstable` diverges (stopped on a non-finite loss) where
    `stable` does not, or its loss jitters more (standard deviation of the step-to-step changes of the
    logged loss over the run's second half, with the interval of the difference)."""
    source, statement = "Table 3", f"without the stop-gradient training is less stable ({unstable} vs {stable})"
    rows = study.pair(unstable, stable)
    if isinstance(rows, str):
        return not_measured(source, statement, rows)
    stopped = {r["variant"]: str(r.get("stopped") or "") for r in rows}
    if bool(stopped[unstable]) != bool(stopped[stable]):
        which = unstable if stopped[unstable] else stable
        return Claim(source, statement, f"{which} stopped: {stopped[which]}", "1 run each",
                     HOLDS if which == unstable else FAILS)
    losses = [study.curve(r["run_id"], "loss") for r in rows]
    changes = [np.diff(loss[len(loss) // 2:]) for loss in losses]
    if min(map(len, changes)) < 3:
        return not_measured(source, statement, "fewer than 8 logged loss values per run")
    difference = bootstrap(changes, lambda u, s, axis: np.std(u, axis=axis, ddof=1) - np.std(s, axis=axis, ddof=1))
    return Claim(source, statement, f"loss jitter (sd of logged changes, second half): {unstable} "
                 f"{np.std(changes[0], ddof=1):.4f}, {stable} {np.std(changes[1], ddof=1):.4f}; difference "
                 f"{difference.text(digits=4)}", f"1 run each, neither stopped; {len(changes[0])} vs {len(changes[1])} "
                 f"changes; 95% bootstrap interval", difference.verdict)


# ----------------------------------------------------------------------------- representations, few-shot


def pairs_claim(study: Study, source: str, statement: str, higher: tuple[str, str], lower: tuple[str, str]) -> Claim:
    """(variant, kind of pair) `higher`'s [CLS] cosines (jobs.studies.represent) are above `lower`'s."""
    rows = study.pair(*dict.fromkeys((higher[0], lower[0])))
    if isinstance(rows, str):
        return not_measured(source, statement, rows)
    by_variant = {r["variant"]: r for r in rows}
    missing = [v for v in by_variant if by_variant[v]["run_id"] not in study.pairs]
    if missing:
        return not_measured(source, statement, f"no representation analysis of {', '.join(missing)} "
                            f"(jobs.studies.represent)")
    a, b = (study.pairs[by_variant[v]["run_id"]] for v, _ in (higher, lower))
    a, b = a.loc[a["kind"] == higher[1], "cosine"], b.loc[b["kind"] == lower[1], "cosine"]
    difference = median_difference(a, b)
    return Claim(source, statement, f"median cosine: {higher[0]} {higher[1]} {a.median():.3f}, {lower[0]} {lower[1]} "
                 f"{b.median():.3f}; difference {difference.text(digits=3)}",
                 f"{len(a)} vs {len(b)} sentence pairs; 95% bootstrap interval", difference.verdict)


def fewshot_claims(study: Study, source: str, statement: str, better: tuple[str, str],
                   worse: tuple[str, str]) -> list[Claim]:
    """(variant, method) `better`'s few-shot test accuracies are above `worse`'s, per task, over the splits."""
    rows = study.pair(*dict.fromkeys((better[0], worse[0])))
    if isinstance(rows, str):
        return [not_measured(source, statement, rows)]
    by_variant = {r["variant"]: r for r in rows}
    sides = [study.fewshot[(study.fewshot["pretraining_run"] == by_variant[v]["run_id"])
                           & (study.fewshot["method"] == m)].set_index("task") for v, m in (better, worse)]
    tasks = sorted(set(sides[0].index) & set(sides[1].index))
    if not tasks:
        return [not_measured(source, statement, f"no few-shot study with both {' '.join(better)} and {' '.join(worse)} "
                             f"(python -m jobs.finetuning.fewshot)")]
    return [seed_claim(source, f"{statement}: {task}", (" ".join(better), sides[0].loc[task, "values"]),
                       (" ".join(worse), sides[1].loc[task, "values"]), "splits") for task in tasks]


# ----------------------------------------------------------------------------- all claims


def judge(runs: pd.DataFrame, hist: pd.DataFrame, scores: pd.DataFrame, fewshot: pd.DataFrame | None = None,
          pairs: dict[str, pd.DataFrame] | None = None) -> list[Claim]:
    """Every claim, per preset of the study's pretraining runs (one per preset and variant:
    `latest_per_variant`), from their metric histories, the fine-tuning scores (`sweep_scores`, with the
    per-seed values), the few-shot scores (`fewshot_scores`) and the per-pair [CLS] cosines by run id.
    With several presets each claim's source names its preset."""
    fewshot = fewshot if fewshot is not None else pd.DataFrame(columns=["pretraining_run", "task", "method", "values"])
    all_labels = scores[with_fractions(scores)["fraction"] >= 1]
    presets = list(dict.fromkeys(runs["preset"])) or [""]
    claims = []
    for preset in presets:
        study = Study(preset, runs[runs["preset"] == preset], runs[runs["preset"] != preset], hist, all_labels,
                      scores, fewshot, pairs or {})
        found = judge_study(study)
        if len(presets) > 1:
            found = [Claim(f"{c.source} [{preset}]", c.statement, c.numbers, c.basis, c.verdict) for c in found]
        claims += found
    return claims


def judge_study(study: Study) -> list[Claim]:
    clm = "clm_only" if isinstance(study.row("clm_only"), pd.Series) else "cocolm"
    claims = [
        pairs_claim(study, "Fig. 1/5", "random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA",
                    ("electra", "random"), ("cocolm", "random")),
        pairs_claim(study, "Fig. 5", "COCO-LM: similar pairs have higher [CLS] cosine than random pairs",
                    ("cocolm", "similar"), ("cocolm", "random")),
        pairs_claim(study, "Fig. 6", "similar pairs are more aligned with SCL (cocolm) than without (clm_only)",
                    ("cocolm", "similar"), ("clm_only", "similar")),
        rise_claim(study, "Fig. 8", "copy accuracy on replaced tokens rises during pretraining", "cocolm",
                   "copy_accuracy_replaced"),
        rise_claim(study, "Fig. 8", "LM accuracy on replaced tokens rises during pretraining", "cocolm",
                   "lm_accuracy_replaced"),
        signal_claim(study, "Fig. 8", f"CLM ({clm}) finds replaced tokens better than All-Token LM "
                     f"(copy accuracy on replaced tokens)", (clm, "copy_accuracy_replaced"),
                     ("all_token_lm", "copy_accuracy_replaced")),
        signal_claim(study, "Fig. 7a", "SCL raises the positive pairs' [CLS] cosine (cocolm vs clm_only)",
                     ("cocolm", "cls_positive_cosine"), ("clm_only", "cls_positive_cosine")),
        signal_claim(study, "Fig. 7a", "without SCL, positive pairs are less similar than random negatives (clm_only)",
                     ("clm_only", "cls_negative_cosine"), ("clm_only", "cls_positive_cosine")),
        signal_claim(study, "Fig. 7b", "SCL lowers the negative pairs' [CLS] cosine (less degeneration)",
                     ("clm_only", "cls_negative_cosine"), ("cocolm", "cls_negative_cosine")),
    ]
    table1 = "at equal pretraining budgets, fine-tuning median"
    claims += finetuning_claims(study, "Table 1", f"{table1}: cocolm above electra", "cocolm", "electra")
    claims += finetuning_claims(study, "Table 1", f"{table1}: electra above roberta_mlm", "electra", "roberta_mlm")
    for ablation in TABLE3_ABLATIONS:
        note = " (the paper's largest effect, -6.6 on GLUE)" if ablation == "random_replace" else ""
        claims += finetuning_claims(study, "Table 3", f"cocolm above {ablation}{note}", "cocolm", ablation)
    claims += finetuning_claims(study, "Table 3", "relative positions help MNLI (cocolm above no_rel_pos)", "cocolm",
                                "no_rel_pos", tasks=("MNLI-m", "MNLI-mm"))
    claims += finetuning_claims(study, "Table 3", "SCL helps RTE and MRPC (cocolm above clm_only)", "cocolm",
                                "clm_only", tasks=("RTE", "MRPC"))
    for row in CLM_SETUP:
        claims += finetuning_claims(study, "Table 3", f"CLM setup: clm_only above {row}", "clm_only", row)
    claims.append(stability_claim(study))
    claims += finetuning_claims(study, "Fig. 4", "cropping beats the uncropped view (cocolm, crop 0.9, above crop_1.0)",
                                DEFAULT_CROP, "crop_1.0")
    claims += finetuning_claims(study, "Fig. 4", "cropping too much hurts (cocolm, crop 0.9, above crop_0.7)",
                                DEFAULT_CROP, "crop_0.7")
    claims += scl_gain_claim(study)
    claims += fewshot_claims(study, "Table 4", "COCO-LM: prompt-based fine-tuning above the [CLS] head",
                             ("cocolm", "prompt"), ("cocolm", "head"))
    claims += fewshot_claims(study, "Table 4", "prompt-based few-shot: COCO-LM above RoBERTa",
                             ("cocolm", "prompt"), ("roberta_mlm", "prompt"))
    return claims


def claims_markdown(claims: list[Claim]) -> str:
    counts = pd.Series([c.verdict.split(":")[0] for c in claims]).value_counts()
    lines = ["Paper claims, judged from this study's runs (the rules: analysis/claims.py; a difference counts only "
             f"when its {CONFIDENCE:.0%} bootstrap interval excludes 0)\n",
             "Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "\n",
             "| source | claim | numbers | basis | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {c.source} | {c.statement} | {c.numbers} | {c.basis} | **{c.verdict}** |" for c in claims]
    return "\n".join(lines) + "\n"
