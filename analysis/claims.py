"""The paper's claims that a study can measure, each judged over pretraining runs by a stated test.

**The unit of replication is the pretraining run.** The claims are about pretraining objectives, so
every test has one value per pretraining run (`jobs.studies.ablate --pretraining-seeds N` varies the
seed of initialisation, corruption and data order together): a run's fine-tuning seeds are summarised
by their median first, a curve by the mean of its last fifth, a run's sentence-pair cosines by their
mean. The logged values of one curve, or the seeds of one fine-tuning sweep, are never samples.

**Who counts.** Only runs that trained (`jobs.gate`): a variant with fewer than MIN_RUNS
trained runs gets "recipe failed for VARIANT (k of n runs trained: ...)" on every claim that needs it,
and a variant with fewer than MIN_RUNS runs at all "not enough pretraining runs". With 3 runs against
3 an exact permutation test cannot reach 0.05 (its smallest two-sided p is 0.1); with 4 against 4 it
is 0.029.

**The tests.** Two variants (independent runs): the difference of the means over runs, Welch's t-test
and its 95% interval, with the exact permutation test's p beside it (`scipy.stats.permutation_test`,
every relabelling of the runs). The verdict rests on Welch's p: at 4 runs a side the permutation test
cannot go below 2/70 = 0.029, so under Holm's correction over the primary claims it could never
reach significance, whatever the data. A comparison inside each run (two curves, two kinds of sentence pair, the end of a curve
against its start): the per-run differences, a paired t-test and its 95% interval (the exact
sign-flip test cannot reach 0.05 with fewer than 6 runs). PRIMARY claims (Table 1's two rows, Fig. 7a/7b,
Fig. 8's CLM against All-Token LM, Table 3's SCL row) are corrected for multiplicity by Holm's method
(`statsmodels`); every other claim is exploratory, judged at its own p and marked so.

**The verdicts**, with SESOI the declared smallest effect of interest of the metric's kind:

    holds             p < 0.05, the interval excludes 0 on the paper's side, and the estimate reaches SESOI
    does not hold     the same on the other side
    negligible        the whole interval lies within (-SESOI, +SESOI)
    inconclusive      anything else (an interval too wide to say, or an effect below SESOI)
    no variation      neither side varies over runs: never evidence
    not enough pretraining runs, recipe failed, not comparable, not measured: no verdict, with the reason

Where the paper's claim is about certain tasks it is judged on those (relative positions: MNLI; SCL's
Table 3 row: every task, and RTE and MRPC on their own line). Scores of different tasks are never
averaged. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

from jobs.names import PROBE_METRICS, RANDOM_INIT_VARIANT, REPRESENT_METRICS
from jobs.run_tables import BUDGET_PARAMS, with_fractions
from jobs.gate import CRITERIA, UNFINISHED, gate

HOLDS, FAILS, NEGLIGIBLE, INCONCLUSIVE = "holds", "does not hold", "negligible", "inconclusive"
NO_VARIATION = "no variation over runs: not evidence"
FEW_RUNS, RECIPE_FAILED = "not enough pretraining runs", "recipe failed"
NOT_COMPARABLE, NOT_MEASURED = "not comparable", "not measured"
FIRM = (HOLDS, FAILS, NEGLIGIBLE)  # the verdicts that say something about the paper
MIN_RUNS = 4
ALPHA, CONFIDENCE = 0.05, 0.95
PERMUTATIONS, PERMUTATION_SEED = 99_999, 0  # exact whenever the runs have fewer relabellings (4 vs 4: 70)
TAIL = 0.2  # the last fifth of a curve is "its end"; the first fifth its start

# The smallest effect of interest, one per kind of metric, declared before any study ran.
DOWNSTREAM, COSINE, REPLACED, JITTER = "downstream accuracy", "cosine", "accuracy on tokens", "loss jitter"
SESOI = {
    DOWNSTREAM: 0.01,  # one accuracy point: below the spread of fine-tuning seeds, never reported as a gain
    COSINE: 0.02,  # the [CLS] cosines of an untrained encoder move by this much between seeds
    REPLACED: 0.01,  # one token in a hundred: 0.000 -> 0.001 is no rise
    JITTER: 0.005,  # of the sd of logged loss changes (a loss near 7 per part)
}
DEFAULT_CROP = "cocolm"  # the paper's crop fraction (0.9) is cocolm's own
TABLE3_ABLATIONS = ("rtd_only", "scl_rtd", "electra_aux", "random_replace", "converged_aux", "all_token_lm",
                    "cocolm_no_copy")  # clm_only is the SCL row, judged as a primary claim
CLM_SETUP = ("clm_no_copy",)  # Table 3's "CLM Setup" rows, ablations of clm_only (model/variants.py)
PROBE_READOUTS = (("[CLS]", PROBE_METRICS[0]), ("mean-pooled", PROBE_METRICS[1]))


@dataclass(frozen=True)
class Effect:
    """The effect (paper's direction positive), its 95% interval, the test's p and what the test was."""

    value: float
    low: float
    high: float
    p: float
    test: str

    def text(self, scale: float = 1.0, digits: int = 3) -> str:
        return f"{scale * self.value:+.{digits}f} [{scale * self.low:+.{digits}f}, {scale * self.high:+.{digits}f}]"


@dataclass(frozen=True)
class Claim:
    source: str  # where the paper makes it
    statement: str
    numbers: str
    basis: str  # runs per side and the test
    verdict: str  # "" until `decide` judges a measured claim
    primary: bool = False
    effect: Effect | None = None
    sesoi: float = math.nan
    p_adjusted: float = math.nan  # Holm's, for primary claims; the raw p for exploratory ones

    @property
    def family(self) -> str:
        return "primary" if self.primary else "exploratory"


def not_measured(source: str, statement: str, why: str, primary: bool = False) -> Claim:
    """A claim with no verdict: `why` is a reason, or already one of the no-verdict verdicts."""
    verdict = why if why.startswith((NOT_COMPARABLE, NOT_MEASURED, FEW_RUNS, RECIPE_FAILED, NO_VARIATION)) \
        else f"{NOT_MEASURED}: {why}"
    return Claim(source, statement, "-", "-", verdict, primary)


# ----------------------------------------------------------------------------- the tests


def no_spread(values: Sequence[float]) -> bool:
    return len(values) < 2 or float(np.ptp(values)) == 0.0


def independent(higher: Sequence[float], lower: Sequence[float]) -> Effect:
    """mean(higher) - mean(lower) over runs: Welch's t-test and its interval; the exact permutation test's p
    beside it, as a check that needs no normality (it cannot go below 2/70 at 4 runs a side)."""
    a, b = np.asarray(higher, dtype=float), np.asarray(lower, dtype=float)
    welch = stats.ttest_ind(a, b, equal_var=False)
    interval = welch.confidence_interval(CONFIDENCE)
    exact = stats.permutation_test((a, b), lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
                                   permutation_type="independent", vectorized=True, n_resamples=PERMUTATIONS,
                                   alternative="two-sided", rng=np.random.default_rng(PERMUTATION_SEED))
    return Effect(float(a.mean() - b.mean()), float(interval.low), float(interval.high), float(welch.pvalue),
                  f"Welch's t-test over runs and its 95% interval (exact permutation p {exact.pvalue:.3g})")


def paired(differences: Sequence[float]) -> Effect:
    """The mean of per-run differences: a paired t-test and its interval."""
    d = np.asarray(differences, dtype=float)
    result = stats.ttest_1samp(d, 0.0)
    interval = result.confidence_interval(CONFIDENCE)
    return Effect(float(d.mean()), float(interval.low), float(interval.high), float(result.pvalue),
                  "paired t-test over runs, 95% interval")


def verdict(effect: Effect, sesoi: float, p: float) -> str:
    """The verdict of a measured effect: see the module's docstring."""
    if -sesoi < effect.low and effect.high < sesoi:
        return NEGLIGIBLE
    if p < ALPHA and effect.low > 0 and effect.value >= sesoi:
        return HOLDS
    if p < ALPHA and effect.high < 0 and effect.value <= -sesoi:
        return FAILS
    return INCONCLUSIVE


def decide(claims: list[Claim]) -> list[Claim]:
    """Judge every measured claim: Holm's correction over the primary ones, the raw p for the rest."""
    measured = [i for i, c in enumerate(claims) if c.effect is not None]
    primary = [i for i in measured if claims[i].primary]
    adjusted = {i: claims[i].effect.p for i in measured}
    if primary:
        _, corrected, _, _ = multipletests([claims[i].effect.p for i in primary], alpha=ALPHA, method="holm")
        adjusted.update(zip(primary, map(float, corrected)))
    judged = list(claims)
    for i in measured:
        c = claims[i]
        judged[i] = replace(c, verdict=verdict(c.effect, c.sesoi, adjusted[i]), p_adjusted=adjusted[i])
    return judged


def summary_verdict(verdicts: dict[str, str]) -> str:
    """One verdict over tasks that never hides one: the shared verdict, or each verdict with its tasks."""
    if len(set(verdicts.values())) == 1:
        return next(iter(verdicts.values()))
    groups: dict[str, list[str]] = {}
    for task, found in verdicts.items():
        groups.setdefault(found, []).append(task)
    return "mixed: " + "; ".join(f"{found} on {', '.join(tasks)}" for found, tasks in groups.items())


# ----------------------------------------------------------------------------- the study's runs


def run_gate(row: pd.Series):
    """`jobs.gate` on a row of `jobs.run_tables.pretraining_runs`."""
    metrics = {k.removeprefix("metrics."): v for k, v in row.items()
               if k.startswith("metrics.") and isinstance(v, (int, float)) and not math.isnan(v)}
    params = {k.removeprefix("params."): v for k, v in row.items() if k.startswith("params.")}
    return gate(row["variant"], str(row.get("status", "FINISHED")), str(row.get("stopped") or ""), metrics, params)


def with_gate(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with their gate verdict (`gate`), whether they count (`counts`: trained, or the control) and
    the names of the criteria they failed (`failed`)."""
    results = [run_gate(row) for _, row in runs.iterrows()]
    return runs.assign(gate=[r.verdict for r in results], counts=[r.counts for r in results],
                       failed=[r.failed for r in results])


@dataclass(frozen=True)
class Study:
    """The runs of one preset (every run of every variant, gated) with everything the claims read."""

    preset: str
    runs: pd.DataFrame  # with_gate(pretraining_runs) of this preset
    other_presets: pd.DataFrame
    hist: pd.DataFrame
    scores: pd.DataFrame  # sweep_scores on all the labels
    fraction_scores: pd.DataFrame  # sweep_scores with the label fractions
    fewshot: pd.DataFrame

    def group(self, variant: str) -> pd.DataFrame | str:
        """The variant's runs that count (at least MIN_RUNS), else why there is no verdict."""
        mine = self.runs[self.runs["variant"] == variant]
        if mine.empty:
            elsewhere = sorted(set(self.other_presets.loc[self.other_presets["variant"] == variant, "preset"]))
            if elsewhere:
                return f"{NOT_COMPARABLE}: {variant} was pretrained with preset {', '.join(elsewhere)}, not {self.preset}"
            return f"{NOT_MEASURED}: no {variant} pretraining run in the study"
        counted = mine[mine["counts"]]
        if len(counted) >= MIN_RUNS:
            return counted
        # A run still going, or stopped to be resumed, says nothing about the recipe: only a run that ended
        # (FINISHED, or FAILED: a crash or a divergence) can fail the gate.
        unfinished = mine["status"].isin(UNFINISHED)  # the gate never counts such a run
        failed = mine[~mine["counts"] & ~unfinished]
        still = f"; {int(unfinished.sum())} not finished" if unfinished.any() else ""
        if len(failed):
            reasons = pd.Series([f for fs in failed["failed"] for f in fs]).value_counts()
            return (f"{RECIPE_FAILED} for {variant} ({len(counted)} of {len(mine) - int(unfinished.sum())} runs "
                    f"trained: " + "; ".join(f"{reason} failed in {n}" for reason, n in reasons.items())
                    + still + ")")
        return f"{FEW_RUNS} ({variant}: {len(counted)}, at least {MIN_RUNS}{still})"

    def groups(self, *variants: str) -> list[pd.DataFrame] | str:
        """The variants' counted runs when they can be compared (one preset, one budget), else why not."""
        found = [self.group(v) for v in dict.fromkeys(variants)]
        for g in found:
            if isinstance(g, str):
                return g
        budgets = {}
        for g in found:
            for _, row in g.iterrows():
                budgets.setdefault(tuple(row.get(f"params.{p}") for p in BUDGET_PARAMS), set()).add(row["variant"])
        if len(budgets) > 1:
            return (f"{NOT_COMPARABLE}: different pretraining budgets (" + "; ".join(
                f"{', '.join(sorted(v))}: {b[0]} steps of {b[1]} x {b[2]} tokens" for b, v in budgets.items()) + ")")
        # A study resumed on another machine may compute some runs in bf16 and others in fp32 (a CPU without
        # native bf16 runs fp32: model.step.step_precision): a confound, never averaged away. Runs older than
        # the precision tag say nothing and are left out of this check.
        precisions = {}
        for g in found:
            for _, row in g[g.get("precision", pd.Series("", index=g.index)).fillna("") != ""].iterrows():
                precisions.setdefault(row["precision"], set()).add(f"{row['variant']} seed {row['seed']}")
        if len(precisions) > 1:
            return (f"{NOT_COMPARABLE}: runs computed in different precisions (" + "; ".join(
                f"{p}: {', '.join(sorted(v))}" for p, v in sorted(precisions.items())) + ")")
        return found

    def curve(self, run_id: str, key: str) -> np.ndarray:
        values = self.hist[(self.hist["run_id"] == run_id) & (self.hist["key"] == key)]
        return values.sort_values("step")["value"].to_numpy()

    # One value per run: the readouts a claim compares.
    def curve_end(self, key: str, first: bool = False) -> Callable[[pd.Series], float]:
        def value(row: pd.Series) -> float:
            curve = self.curve(row["run_id"], key)
            if len(curve) < 2:
                return math.nan
            n = max(1, int(round(TAIL * len(curve))))
            return float(np.mean(curve[:n] if first else curve[-n:]))
        return value

    def finetuned(self, task: str, scores: pd.DataFrame | None = None) -> Callable[[pd.Series], float]:
        """A run's fine-tuning score on `task`: the median over its fine-tuning seeds at the chosen grid point."""
        table = self.scores if scores is None else scores
        mine = table.set_index(["pretraining_run", "task"])["values"].to_dict() if len(table) else {}

        def value(row: pd.Series) -> float:
            seeds = mine.get((row["run_id"], task))
            return float(np.median(seeds)) if seeds else math.nan
        return value


def metric(key: str) -> Callable[[pd.Series], float]:
    """A run's logged metric (its last value)."""
    def value(row: pd.Series) -> float:
        found = row.get(f"metrics.{key}", math.nan)
        return math.nan if found is None else float(found)
    return value


def values_of(group: pd.DataFrame, value: Callable[[pd.Series], float]) -> list[float]:
    return [v for v in (value(row) for _, row in group.iterrows()) if not math.isnan(v)]


# ----------------------------------------------------------------------------- two kinds of comparison


def between(study: Study, source: str, statement: str, better: str, worse: str,
            value: Callable[[pd.Series], float], kind: str, what: str, primary: bool = False) -> Claim:
    """`better`'s runs above `worse`'s on one value per run (independent groups of runs)."""
    groups = study.groups(better, worse)
    if isinstance(groups, str):
        return not_measured(source, statement, groups, primary)
    a, b = values_of(groups[0], value), values_of(groups[1], value)
    if min(len(a), len(b)) < MIN_RUNS:
        return not_measured(source, statement, f"{what} measured on {len(a)} {better} and {len(b)} {worse} runs "
                            f"(at least {MIN_RUNS} each)", primary)
    numbers = f"{what}, mean over runs: {better} {np.mean(a):.3f}, {worse} {np.mean(b):.3f}"
    if no_spread(a) and no_spread(b):
        return Claim(source, statement, numbers, f"{len(a)} vs {len(b)} pretraining runs", NO_VARIATION, primary)
    effect = independent(a, b)
    return Claim(source, statement, f"{numbers}; difference {effect.text()}",
                 f"{len(a)} vs {len(b)} pretraining runs; {effect.test}; p {effect.p:.3g}", "", primary, effect,
                 SESOI[kind])


def within(study: Study, source: str, statement: str, variant: str, higher: Callable[[pd.Series], float],
           lower: Callable[[pd.Series], float], kind: str, what: tuple[str, str], primary: bool = False) -> Claim:
    """In each of `variant`'s runs `higher` is above `lower`: the per-run differences, tested paired."""
    group = study.groups(variant)
    if isinstance(group, str):
        return not_measured(source, statement, group, primary)
    pairs = [(higher(row), lower(row)) for _, row in group[0].iterrows()]
    pairs = [(h, l) for h, l in pairs if not (math.isnan(h) or math.isnan(l))]
    if len(pairs) < MIN_RUNS:
        return not_measured(source, statement, f"{what[0]} and {what[1]} measured on {len(pairs)} {variant} runs "
                            f"(at least {MIN_RUNS})", primary)
    differences = [h - l for h, l in pairs]
    numbers = (f"{variant}, mean over runs: {what[0]} {np.mean([h for h, _ in pairs]):.3f}, "
               f"{what[1]} {np.mean([l for _, l in pairs]):.3f}")
    if no_spread(differences):
        return Claim(source, statement, numbers, f"{len(pairs)} pretraining runs, paired", NO_VARIATION, primary)
    effect = paired(differences)
    return Claim(source, statement, f"{numbers}; difference {effect.text()}",
                 f"{len(pairs)} pretraining runs, paired; {effect.test}; p {effect.p:.3g}", "", primary, effect,
                 SESOI[kind])


# ----------------------------------------------------------------------------- the claims by readout


def finetuning_claims(study: Study, source: str, statement: str, better: str, worse: str,
                      tasks: Sequence[str] | None = None, primary: bool = False) -> list[Claim]:
    """`better` fine-tunes above `worse`: a line per task (only `tasks` when the paper's claim is about those),
    and a summary line when there are several."""
    rows = study.groups(better, worse)
    if isinstance(rows, str):
        return [not_measured(source, statement, rows, primary)]
    ids = [set(g["run_id"]) for g in rows]
    shared = sorted(set.intersection(*[set(study.scores.loc[study.scores["pretraining_run"].isin(i), "task"])
                                       for i in ids]))
    shared = [t for t in shared if tasks is None or t in tasks]
    if not shared:
        wanted = f" on {', '.join(tasks)}" if tasks else ""
        return [not_measured(source, statement, f"{better} and {worse} share no fine-tuned task{wanted}", primary)]
    claims = [between(study, source, f"{statement}: {task}", better, worse, study.finetuned(task), DOWNSTREAM,
                      f"{task} fine-tuning (median over seeds per run)", primary) for task in shared]
    return claims


def with_summaries(claims: list[Claim]) -> list[Claim]:
    """After `decide`: a summary line after each group of per-task lines of one statement."""
    out: list[Claim] = []
    groups: dict[tuple[str, str], list[Claim]] = {}
    for c in claims:
        head, _, task = c.statement.rpartition(": ")
        if head and c.effect is not None:
            groups.setdefault((c.source, head), []).append(c)
    done = set()
    for c in claims:
        out.append(c)
        key = (c.source, c.statement.rpartition(": ")[0])
        lines = groups.get(key, [])
        if len(lines) > 1 and c is lines[-1] and key not in done:
            done.add(key)
            verdicts = {x.statement.rpartition(": ")[2]: x.verdict for x in lines}
            out.append(Claim(c.source, f"{key[1]}: all {len(lines)} tasks", "per task above, never averaged",
                             "the task lines", summary_verdict(verdicts), c.primary))
    return out


def probe_claims(study: Study, source: str, statement: str, better: str, worse: str) -> list[Claim]:
    """The same comparison on the linear probes of the frozen encoder (jobs.studies.probe)."""
    return [between(study, source, f"{statement} (linear probe on {name}, SNLI test)", better, worse, metric(key),
                    DOWNSTREAM, f"probe accuracy on {name}") for name, key in PROBE_READOUTS]


def control_claims(study: Study) -> list[Claim]:
    """Every variant against the randomly initialised encoder of the same shape, on every downstream readout."""
    claims = []
    for variant in dict.fromkeys(study.runs["variant"]):
        if variant == RANDOM_INIT_VARIANT:
            continue
        statement = f"{variant} beats the random-init encoder"
        claims += finetuning_claims(study, "control", statement, variant, RANDOM_INIT_VARIANT)
        claims += probe_claims(study, "control", statement, variant, RANDOM_INIT_VARIANT)
    return [c for c in claims if not c.verdict.startswith(f"{NOT_MEASURED}: no {RANDOM_INIT_VARIANT}")]


def scl_gain_claim(study: Study, with_scl: str = "cocolm", without_scl: str = "clm_only") -> list[Claim]:
    """Fig. 7c/d: the SCL gain is larger at the smallest label fraction than at the largest, per task: per run,
    its score at the smallest fraction minus its score at the largest; the two variants' runs compared."""
    statement = f"the SCL gain ({with_scl} - {without_scl}) grows as labels shrink"
    rows = study.groups(with_scl, without_scl)
    if isinstance(rows, str):
        return [not_measured("Fig. 7c/d", statement, rows)]
    points = with_fractions(study.fraction_scores)
    mine = points[points["pretraining_run"].isin(set(rows[0]["run_id"]) | set(rows[1]["run_id"]))]
    claims = []
    for task, by_task in mine.groupby("base"):
        fractions = sorted(set(by_task["fraction"]))
        if len(fractions) < 2:
            continue
        low, high = fractions[0], fractions[-1]
        scores = by_task.set_index(["pretraining_run", "fraction"])["values"].to_dict()

        def drop(row: pd.Series, low=low, high=high, scores=scores) -> float:
            a, b = scores.get((row["run_id"], low)), scores.get((row["run_id"], high))
            return float(np.median(a) - np.median(b)) if a and b else math.nan
        claims.append(between(study, "Fig. 7c/d", f"{statement}: {task}, {low:g} vs {high:g} of the labels",
                              with_scl, without_scl, drop, DOWNSTREAM,
                              f"score at {low:g} minus at {high:g} of the labels"))
    return claims or [not_measured("Fig. 7c/d", statement, f"{with_scl} and {without_scl} share no task fine-tuned "
                                   f"on two or more label fractions (--label-fractions)")]


def stability_claim(study: Study, unstable: str = "clm_no_stopgrad", stable: str = "clm_only") -> Claim:
    """Table 3's stop-gradient row is about stability: per run, the sd of the step-to-step changes of the
    logged loss over its second half (a run that stopped on a non-finite loss fails the gate and is named)."""
    def jitter(row: pd.Series) -> float:
        loss = study.curve(row["run_id"], "loss")
        changes = np.diff(loss[len(loss) // 2:])
        return float(np.std(changes, ddof=1)) if len(changes) >= 3 else math.nan
    return between(study, "Table 3", f"without the stop-gradient training is less stable ({unstable} vs {stable})",
                   unstable, stable, jitter, JITTER, "loss jitter (sd of logged changes, second half)")


def fewshot_claims(study: Study, source: str, statement: str, better: tuple[str, str],
                   worse: tuple[str, str]) -> list[Claim]:
    """(variant, method) `better`'s few-shot test accuracy (mean over splits per run) above `worse`'s."""
    table = study.fewshot.set_index(["pretraining_run", "method", "task"])["values"].to_dict() \
        if len(study.fewshot) else {}
    tasks = sorted(set(study.fewshot["task"])) if len(study.fewshot) else []
    if not tasks:
        return [not_measured(source, statement, f"no few-shot study of {better[0]} (python -m jobs.finetuning.fewshot)")]

    def accuracy(method: str, task: str) -> Callable[[pd.Series], float]:
        def value(row: pd.Series) -> float:
            found = table.get((row["run_id"], method, task))
            return float(np.mean(found)) if found else math.nan
        return value
    if better[0] == worse[0]:
        return [within(study, source, f"{statement}: {task}", better[0], accuracy(better[1], task),
                       accuracy(worse[1], task), DOWNSTREAM, (better[1], worse[1])) for task in tasks]
    return [between(study, source, f"{statement}: {task}", better[0], worse[0], _both(accuracy(better[1], task),
                    accuracy(worse[1], task), better[0]), DOWNSTREAM, f"{task} few-shot test accuracy")
            for task in tasks]


def _both(mine: Callable, theirs: Callable, variant: str) -> Callable[[pd.Series], float]:
    """One value function for two variants read through different methods."""
    return lambda row: mine(row) if row["variant"] == variant else theirs(row)


# ----------------------------------------------------------------------------- all claims


def judge(runs: pd.DataFrame, hist: pd.DataFrame, scores: pd.DataFrame,
          fewshot: pd.DataFrame | None = None) -> list[Claim]:
    """Every claim, per preset, over every pretraining run (`jobs.run_tables.pretraining_runs`, one row per run and
    seed), from their metric histories, the fine-tuning scores (`sweep_scores`, with the per-seed values) and
    the few-shot scores (`fewshot_scores`). Holm's correction runs over all primary claims of all presets."""
    fewshot = fewshot if fewshot is not None else pd.DataFrame(columns=["pretraining_run", "task", "method", "values"])
    all_labels = scores[with_fractions(scores)["fraction"] >= 1]
    gated = with_gate(runs) if len(runs) else runs.assign(gate=[], counts=[], failed=[])
    presets = list(dict.fromkeys(gated["preset"])) or [""]
    claims = []
    for preset in presets:
        study = Study(preset, gated[gated["preset"] == preset], gated[gated["preset"] != preset], hist, all_labels,
                      scores, fewshot)
        found = judge_study(study)
        if len(presets) > 1:
            found = [replace(c, source=f"{c.source} [{preset}]") for c in found]
        claims += found
    return with_summaries(decide(claims))


def judge_study(study: Study) -> list[Claim]:
    clm = "clm_only" if "clm_only" in set(study.runs["variant"]) else "cocolm"
    random_cos, similar_cos = metric(REPRESENT_METRICS[0]), metric(REPRESENT_METRICS[1])
    claims = [
        between(study, "Fig. 1/5", "random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA", "electra", "cocolm",
                random_cos, COSINE, "mean random-pair [CLS] cosine"),
        within(study, "Fig. 5", "COCO-LM: similar pairs have higher [CLS] cosine than random pairs", "cocolm",
               similar_cos, random_cos, COSINE, ("similar pairs", "random pairs")),
        between(study, "Fig. 6", "similar pairs are more aligned with SCL (cocolm) than without (clm_only)", "cocolm",
                "clm_only", similar_cos, COSINE, "mean similar-pair [CLS] cosine"),
        within(study, "Fig. 8", "copy accuracy on replaced tokens rises during pretraining", "cocolm",
               study.curve_end("copy_accuracy_replaced"), study.curve_end("copy_accuracy_replaced", first=True),
               REPLACED, ("last fifth", "first fifth")),
        within(study, "Fig. 8", "LM accuracy on replaced tokens rises during pretraining", "cocolm",
               study.curve_end("lm_accuracy_replaced"), study.curve_end("lm_accuracy_replaced", first=True),
               REPLACED, ("last fifth", "first fifth")),
        between(study, "Fig. 8", f"CLM ({clm}) finds replaced tokens better than All-Token LM (copy accuracy on "
                f"replaced tokens)", clm, "all_token_lm", study.curve_end("copy_accuracy_replaced"), REPLACED,
                "copy accuracy on replaced tokens, last fifth", primary=True),
        between(study, "Fig. 7a", "SCL raises the positive pairs' [CLS] cosine (cocolm vs clm_only)", "cocolm",
                "clm_only", study.curve_end("cls_positive_cosine"), COSINE, "positive-pair [CLS] cosine, last fifth",
                primary=True),
        within(study, "Fig. 7a", "without SCL, positive pairs are less similar than random negatives (clm_only)",
               "clm_only", study.curve_end("cls_negative_cosine"), study.curve_end("cls_positive_cosine"), COSINE,
               ("negative pairs", "positive pairs")),
        between(study, "Fig. 7b", "SCL lowers the negative pairs' [CLS] cosine (less degeneration)", "clm_only",
                "cocolm", study.curve_end("cls_negative_cosine"), COSINE, "negative-pair [CLS] cosine, last fifth",
                primary=True),
    ]
    table1 = "at equal pretraining budgets, fine-tuning"
    for better, worse in (("cocolm", "electra"), ("electra", "roberta_mlm")):
        claims += finetuning_claims(study, "Table 1", f"{table1}: {better} above {worse}", better, worse, primary=True)
        claims += probe_claims(study, "Table 1", f"at equal pretraining budgets: {better} above {worse}", better, worse)
    claims += finetuning_claims(study, "Table 3", "SCL helps (cocolm above clm_only)", "cocolm", "clm_only",
                                primary=True)
    claims += finetuning_claims(study, "Table 3", "SCL helps RTE and MRPC (cocolm above clm_only)", "cocolm",
                                "clm_only", tasks=("RTE", "MRPC"))
    for ablation in TABLE3_ABLATIONS:
        note = " (the paper's largest effect, -6.6 on GLUE)" if ablation == "random_replace" else ""
        claims += finetuning_claims(study, "Table 3", f"cocolm above {ablation}{note}", "cocolm", ablation)
    claims += finetuning_claims(study, "Table 3", "relative positions help MNLI (cocolm above no_rel_pos)", "cocolm",
                                "no_rel_pos", tasks=("MNLI-m", "MNLI-mm"))
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
    claims += control_claims(study)
    return claims


# ----------------------------------------------------------------------------- the report's claims.md


def gate_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (preset, variant): runs, trained runs, and each failed criterion with how many runs failed it."""
    if runs.empty:
        return pd.DataFrame(columns=["preset", "variant", "runs", "trained", "failed criteria"])
    gated = with_gate(runs)
    rows = []
    for (preset, variant), group in gated.groupby(["preset", "variant"], sort=False):
        reasons = pd.Series([f for fs in group["failed"] for f in fs]).value_counts()
        control = variant == RANDOM_INIT_VARIANT
        rows.append({"preset": preset, "variant": variant, "runs": len(group),
                     "trained": "control (not gated)" if control else int((group["gate"] == "trained").sum()),
                     "failed criteria": "; ".join(f"{r} ({n})" for r, n in reasons.items()) or "-"})
    return pd.DataFrame(rows)


def rules_text() -> str:
    criteria = "\n".join(f"- {c.name}: {c.text()}" + (f" (where {c.needs_param} is true)" if c.needs_param else "")
                         + f". {c.reason}." for c in CRITERIA)
    sesoi = ", ".join(f"{kind} {value:g}" for kind, value in SESOI.items())
    return (f"A run counts only if it trained (jobs/gate.py):\n\n{criteria}\n\n"
            f"A comparison needs at least {MIN_RUNS} counted pretraining runs a side; each run gives one value "
            f"(fine-tuning: the median over its seeds; a curve: the mean of its last fifth). Two variants: Welch's "
            f"t-test and its {CONFIDENCE:.0%} interval (the exact permutation p beside it); within runs: paired "
            f"t-test. Primary claims are "
            f"Holm-corrected; the rest are exploratory. Smallest effects of interest: {sesoi}. \"holds\" needs "
            f"p < {ALPHA} and the estimate past it; \"negligible\": the interval inside it.\n")


def claims_markdown(claims: list[Claim], runs: pd.DataFrame | None = None) -> str:
    lines = ["# Paper claims, judged over pretraining runs (analysis/claims.py)\n"]
    if runs is not None:
        table = gate_table(runs)
        lines += ["## The gate: runs that trained\n", "| preset | variant | runs | trained | failed criteria |",
                  "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
        lines.append("")
    lines += ["## The rules\n", rules_text()]
    for family in ("primary", "exploratory"):
        counts = pd.Series([c.verdict.split(":")[0].split(" (")[0] for c in claims if c.family == family]).value_counts()
        lines.append(f"Verdicts ({family}): " + (", ".join(f"{n} {v}" for v, n in counts.items()) or "none"))
    lines += ["", "## The claims\n", "| family | source | claim | numbers | basis | p (Holm for primary) | verdict |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {c.family} | {c.source} | {c.statement} | {c.numbers} | {c.basis} | "
              f"{'-' if math.isnan(c.p_adjusted) else f'{c.p_adjusted:.3g}'} | **{c.verdict}** |" for c in claims]
    return "\n".join(lines) + "\n"
