"""analysis.claims: each rule of the verdicts on hand-made runs, histories and per-seed scores.

The pretraining run is the unit of replication: every fixture here has one row per run (variant, seed)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.claims import (FAILS, FEW_RUNS, FIRM, HOLDS, INCONCLUSIVE, MIN_RUNS, NEGLIGIBLE, NO_VARIATION,
                             NOT_COMPARABLE, RECIPE_FAILED, Claim, Effect, claims_markdown, decide, independent, judge,
                             paired, summary_verdict)
from jobs.names import PROBE_METRICS, RANDOM_INIT_VARIANT, REPRESENT_METRICS

EMPTY_HISTORY = pd.DataFrame(columns=["run_id", "key", "step", "value"])
TRAINED = {"aux_mlm_accuracy": 0.12, "copy_accuracy_replaced": 0.14, REPRESENT_METRICS[0]: 0.9}


def runs(preset: str = "tiny", steps: str = "40", seeds: int = MIN_RUNS, **variants) -> pd.DataFrame:
    """`variant=metrics` (one dict for every run, or a list: one dict per run): one row per pretraining run."""
    rows = []
    for v, metrics in variants.items():
        per_run = metrics if isinstance(metrics, list) else [metrics] * seeds
        for seed, m in enumerate(per_run):
            rows.append({"run_id": f"run-{v}-{seed}", "variant": v, "preset": preset, "seed": str(seed),
                         "status": "FINISHED", "stopped": "", "params.train.max_steps": steps,
                         "params.train.global_batch": "32", "params.data.seq_len": "64",
                         "params.objective.use_copy_loss": "True",
                         **{f"metrics.{k}": x for k, x in {**TRAINED, **m}.items()}})
    return pd.DataFrame(rows)


def history(run_id: str, key: str, values) -> pd.DataFrame:
    return pd.DataFrame({"run_id": run_id, "key": key, "step": range(10, 10 * len(values) + 1, 10),
                         "value": list(values)})


def scores(rows: list[tuple[str, str, list[tuple[float, ...]]]]) -> pd.DataFrame:
    """(variant, task, per run: its fine-tuning seeds' scores) -> sweep_scores' columns."""
    out = [{"pretraining_run": f"run-{v}-{i}", "task": t, "score": float(np.median(s)), "min": min(s), "max": max(s),
            "values": tuple(s), "seeds": len(s)} for v, t, per_run in rows for i, s in enumerate(per_run)]
    return pd.DataFrame(out, columns=["pretraining_run", "task", "score", "min", "max", "values", "seeds"])


def spread(centre: float, step: float = 0.01, n: int = MIN_RUNS) -> list[tuple[float, ...]]:
    """n runs whose fine-tuning medians are centre + step * (-1.5 .. 1.5); five seeds each around it."""
    offsets = np.linspace(-1.5, 1.5, n) * step
    return [tuple(centre + o + d for d in (-0.002, -0.001, 0.0, 0.001, 0.002)) for o in offsets]


def by_statement(claims) -> dict:
    return {c.statement: c for c in claims}


def verdict(claims, statement: str) -> str:
    return by_statement(claims)[statement].verdict


TABLE1_ROW = "at equal pretraining budgets, fine-tuning: cocolm above electra"  # a line for all tasks: no verdict
TABLE1 = f"{TABLE1_ROW}: SNLI"


# ----------------------------------------------------------------------------- the tests themselves


def test_two_variants_are_compared_by_welch_with_the_exact_permutation_p_beside():
    effect = independent([0.80, 0.81, 0.82, 0.83], [0.70, 0.71, 0.72, 0.73])
    assert effect.value == pytest.approx(0.10) and 0 < effect.low < 0.10 < effect.high
    welch = stats.ttest_ind([0.80, 0.81, 0.82, 0.83], [0.70, 0.71, 0.72, 0.73], equal_var=False)
    assert effect.p == pytest.approx(welch.pvalue) and effect.p < 1e-4
    assert "exact permutation p 0.0286" in effect.test  # every relabelling of 8 runs: the two extremes of 70
    assert "exact permutation p 0.1)" in independent([0.80, 0.81, 0.82], [0.70, 0.71, 0.72]).test


def test_paired_differences_are_tested_paired():
    """Runs whose levels differ widely but whose within-run difference is steady: the paired test sees it."""
    higher, lower = [0.30, 0.50, 0.70, 0.90], [0.27, 0.48, 0.66, 0.87]
    assert paired([h - l for h, l in zip(higher, lower)]).p < 0.01
    assert independent(higher, lower).p > 0.5


# ----------------------------------------------------------------------------- replication


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fewer_than_four_runs_a_side_is_never_a_verdict(n):
    study = runs(seeds=n, cocolm={}, electra={})
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", spread(0.80, n=n)),
                                                 ("electra", "SNLI", spread(0.60, n=n))]))
    assert verdict(claims, TABLE1_ROW) == f"{FEW_RUNS} (cocolm: {n}, at least {MIN_RUNS})"


def test_a_one_seed_study_has_no_firm_verdict_anywhere_in_claims_md():
    """One pretraining run per variant, each with five well-separated fine-tuning seeds and long curves:
    the old rules said "holds" on all of them."""
    variants = ("cocolm", "electra", "roberta_mlm", "clm_only", "all_token_lm", "random_replace")
    study = runs(seeds=1, **{v: {} for v in variants})
    hist = pd.concat([history(f"run-{v}-0", key, np.linspace(0.0, 0.5 + 0.05 * i, 40))
                      for i, v in enumerate(variants) for key in ("copy_accuracy_replaced", "cls_positive_cosine",
                                                                   "cls_negative_cosine", "lm_accuracy_replaced")])
    claims = judge(study, hist, scores([(v, "SNLI", [tuple(0.5 + 0.05 * i + d for d in (0, .001, .002, .003, .004))])
                                        for i, v in enumerate(variants)]))
    assert claims and not [c for c in claims if c.verdict in FIRM]
    text = claims_markdown(claims, study)
    assert "**holds**" not in text and "**does not hold**" not in text and "**negligible**" not in text


def test_a_run_is_one_value_its_fine_tuning_seeds_are_summarised_first():
    """Each run's seeds are far apart, but the runs' medians are separated: the test sees four values a side."""
    wide = [tuple(m + d for d in (-0.2, -0.1, 0.0, 0.1, 0.2)) for m in (0.80, 0.81, 0.82, 0.83)]
    low = [tuple(m + d for d in (0.2, -0.2, 0.0, 0.1, -0.1)) for m in (0.70, 0.71, 0.72, 0.73)]  # first seed high
    claims = judge(runs(cocolm={}, electra={}), EMPTY_HISTORY, scores([("cocolm", "SNLI", wide),
                                                                       ("electra", "SNLI", low)]))
    claim = by_statement(claims)[TABLE1]
    assert "4 vs 4 pretraining runs" in claim.basis and claim.effect.value == pytest.approx(0.10)
    assert claim.verdict == HOLDS and claim.effect.p == pytest.approx(stats.ttest_ind([0.80, 0.81, 0.82, 0.83], [0.70, 0.71, 0.72, 0.73],
                                                           equal_var=False).pvalue)


def test_a_curve_claim_takes_one_number_per_run_never_the_logged_values():
    """One run per side with 40 logged values each used to be a 8-vs-8 bootstrap; now it is 1 vs 1 runs."""
    study = runs(seeds=1, clm_only={}, all_token_lm={})
    hist = pd.concat([history("run-clm_only-0", "copy_accuracy_replaced", np.full(40, 0.30)),
                      history("run-all_token_lm-0", "copy_accuracy_replaced", np.full(40, 0.10))])
    claims = judge(study, hist, scores([]))
    claim = next(c for c in claims if c.statement.startswith("CLM (clm_only) finds replaced tokens"))
    assert claim.verdict.startswith(FEW_RUNS)
    many = runs(clm_only={}, all_token_lm={})
    hist = pd.concat([history(f"run-{v}-{i}", "copy_accuracy_replaced", np.r_[np.zeros(30), np.full(10, level + i / 100)])
                      for v, level in (("clm_only", 0.30), ("all_token_lm", 0.10)) for i in range(MIN_RUNS)])
    claim = next(c for c in judge(many, hist, scores([])) if c.statement.startswith("CLM (clm_only)"))
    assert claim.verdict == HOLDS and "4 vs 4 pretraining runs" in claim.basis
    assert "clm_only 0.315, all_token_lm 0.115" in claim.numbers  # the mean of each run's last fifth


# ----------------------------------------------------------------------------- verdicts


def test_smallest_effect_of_interest_makes_tiny_rises_negligible_not_holds():
    """LM accuracy on replaced tokens 0.000 -> 0.001 used to "hold"."""
    study = runs(cocolm={})
    hist = pd.concat([history(f"run-cocolm-{i}", "lm_accuracy_replaced", np.r_[np.zeros(8), np.full(2, 0.001 + i * 1e-4)])
                      for i in range(MIN_RUNS)])
    claims = judge(study, hist, scores([]))
    claim = by_statement(claims)["LM accuracy on replaced tokens rises during pretraining"]
    assert claim.effect.p < 0.001 and claim.verdict == NEGLIGIBLE


def test_a_clear_effect_holds_and_the_other_way_does_not_hold():
    study = runs(cocolm={}, electra={}, roberta_mlm={"mlm_accuracy": 0.15})
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", spread(0.80)), ("electra", "SNLI", spread(0.70)),
                                                 ("roberta_mlm", "SNLI", spread(0.78))]))
    assert verdict(claims, TABLE1) == HOLDS
    assert verdict(claims, "at equal pretraining budgets, fine-tuning: electra above roberta_mlm: SNLI") == FAILS


def test_an_effect_whose_interval_straddles_the_smallest_effect_is_inconclusive():
    study = runs(cocolm={}, electra={})
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", spread(0.80, step=0.04)),
                                                 ("electra", "SNLI", spread(0.79, step=0.04))]))
    assert verdict(claims, TABLE1) == INCONCLUSIVE


def test_sides_without_variation_are_never_evidence():
    """[0.81] * n against [0.80] * n used to collapse the interval to a point and "hold"."""
    study = runs(cocolm={}, electra={})
    same = [(0.81,) * 5] * MIN_RUNS
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", same), ("electra", "SNLI", [(0.80,) * 5] * MIN_RUNS)]))
    assert verdict(claims, TABLE1) == NO_VARIATION


def test_holm_corrects_the_primary_claims_and_leaves_exploratory_ones_alone():
    """Three primary claims at p = 0.02 hold alone, not together (Holm: 3 x 0.02); exploratory ones keep their p."""
    def claim(name: str, primary: bool) -> Claim:
        return Claim("src", name, "", "", "", primary, Effect(0.05, 0.01, 0.09, 0.02, "test"), 0.01)
    assert [c.verdict for c in decide([claim("a", True)])] == [HOLDS]
    together = decide([claim("a", True), claim("b", True), claim("c", True), claim("d", False)])
    assert [c.verdict for c in together] == [INCONCLUSIVE] * 3 + [HOLDS]
    assert [c.p_adjusted for c in together] == pytest.approx([0.06, 0.06, 0.06, 0.02])
    study = runs(cocolm={}, electra={}, roberta_mlm={"mlm_accuracy": 0.15})
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", spread(0.80)), ("electra", "SNLI", spread(0.70)),
                                                 ("roberta_mlm", "SNLI", spread(0.60))]))
    table1 = [c for c in claims if c.effect is not None and c.primary]
    low, high = sorted(c.effect.p for c in table1)
    assert len(table1) == 2 and sorted(c.p_adjusted for c in table1) == pytest.approx([2 * low, max(2 * low, high)])
    assert "| primary | Table 1 |" in claims_markdown(claims) and "| exploratory |" in claims_markdown(claims)


# ----------------------------------------------------------------------------- the gate


def test_runs_that_did_not_train_give_recipe_failed_with_the_reason():
    """electra's discriminator found no replaced token in any run: no verdict against it, with the reason."""
    study = runs(cocolm={}, electra={"copy_accuracy_replaced": 0.0})
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", spread(0.80)), ("electra", "SNLI", spread(0.33))]))
    assert verdict(claims, TABLE1_ROW) == (f"{RECIPE_FAILED} for electra (0 of 4 runs trained: replaced tokens found "
                                       f"failed in 4)")
    text = claims_markdown(claims, study)
    assert text.index("The gate") < text.index("The claims")
    assert "| tiny | electra | 4 | 0 | replaced tokens found (4) |" in text


def test_a_variant_keeps_its_trained_runs_when_enough_of_them_trained():
    collapsed = {REPRESENT_METRICS[0]: 0.999}
    study = runs(cocolm={}, electra=[{}, {}, {}, {}, collapsed])
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", spread(0.80)),
                                                 ("electra", "SNLI", [*spread(0.70), (0.9,) * 5])]))
    claim = by_statement(claims)[TABLE1]
    assert claim.verdict == HOLDS and "4 vs 4 pretraining runs" in claim.basis  # the collapsed run left out
    three = runs(cocolm={}, electra=[{}, {}, {}, collapsed])
    assert verdict(judge(three, EMPTY_HISTORY, scores([])), TABLE1_ROW).startswith(
        f"{RECIPE_FAILED} for electra (3 of 4 runs trained: [CLS] not collapsed failed in 1)")


def test_the_tiny_study_where_nothing_learned_gets_recipe_failed():
    """The `tiny` study with one seed and 30 steps: every [CLS] cosine 1.000, heads at their priors."""
    untrained = {"aux_mlm_accuracy": 0.04, "copy_accuracy_replaced": 0.0, REPRESENT_METRICS[0]: 1.0}
    study = runs(seeds=1, cocolm=untrained, electra=untrained)
    claims = judge(study, EMPTY_HISTORY, scores([]))
    fig1 = by_statement(claims)["random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA"]
    assert fig1.verdict.startswith(f"{RECIPE_FAILED} for electra (0 of 1 runs trained: auxiliary left the unigram "
                                   f"plateau failed in 1; replaced tokens found failed in 1; [CLS] not collapsed")


def test_every_variant_is_compared_with_the_random_init_control():
    study = runs(cocolm={}, roberta_mlm={"mlm_accuracy": 0.15}, **{RANDOM_INIT_VARIANT: {"copy_accuracy_replaced": 0.0}})
    probe = {PROBE_METRICS[0]: 0.5, PROBE_METRICS[1]: 0.5}
    for v, level in (("cocolm", 0.6), ("roberta_mlm", 0.5), (RANDOM_INIT_VARIANT, 0.5)):
        for i in range(MIN_RUNS):
            study.loc[study["run_id"] == f"run-{v}-{i}", [f"metrics.{k}" for k in probe]] = level + i / 100
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", spread(0.60)),
                                                 ("roberta_mlm", "SNLI", spread(0.40, step=0.002)),
                                                 (RANDOM_INIT_VARIANT, "SNLI", spread(0.40, step=0.002))]))
    assert verdict(claims, "cocolm beats the random-init encoder: SNLI") == HOLDS
    assert verdict(claims, "roberta_mlm beats the random-init encoder: SNLI") == NEGLIGIBLE
    assert verdict(claims, "cocolm beats the random-init encoder (linear probe on [CLS], SNLI test)") == HOLDS
    assert "| tiny | random_init | 4 | control (not gated) | - |" in claims_markdown(claims, study)


# ----------------------------------------------------------------------------- which claims, where


def test_a_task_going_the_other_way_is_named_in_the_summary_and_tasks_are_never_averaged():
    study = runs(cocolm={}, rtd_only={})
    claims = judge(study, EMPTY_HISTORY, scores([
        ("cocolm", "SNLI", spread(0.90)), ("rtd_only", "SNLI", spread(0.60)),
        ("cocolm", "CoLA", spread(0.30)), ("rtd_only", "CoLA", spread(0.40))]))
    summary = by_statement(claims)["cocolm above rtd_only: all 2 tasks"]
    assert summary.verdict == "mixed: does not hold on CoLA; holds on SNLI"
    assert "never averaged" in summary.numbers
    assert summary_verdict({"A": HOLDS, "B": HOLDS}) == HOLDS


def test_relative_positions_are_judged_on_mnli_only():
    study = runs(cocolm={}, no_rel_pos={})
    snli_only = scores([("cocolm", "SNLI", spread(0.90)), ("no_rel_pos", "SNLI", spread(0.60))])
    (claim,) = [c for c in judge(study, EMPTY_HISTORY, snli_only) if "no_rel_pos" in c.statement]
    assert claim.verdict.startswith("not measured") and "MNLI-m" in claim.verdict
    with_mnli = pd.concat([snli_only, scores([("cocolm", "MNLI-m", spread(0.80)), ("no_rel_pos", "MNLI-m", spread(0.70))])])
    mine = [c for c in judge(study, EMPTY_HISTORY, with_mnli) if "no_rel_pos" in c.statement]
    assert [(c.statement.rsplit(": ", 1)[1], c.verdict) for c in mine] == [("MNLI-m", HOLDS)]


def test_runs_of_another_preset_are_not_comparable_and_the_reason_says_so():
    study = pd.concat([runs(cocolm={}), runs(preset="study", rtd_only={})])
    finetuned = scores([("cocolm", "SNLI", spread(0.9)), ("rtd_only", "SNLI", spread(0.5))])
    claims = [c for c in judge(study, EMPTY_HISTORY, finetuned) if c.statement == "cocolm above rtd_only"]
    assert {(c.source, c.verdict) for c in claims} == {
        ("Table 3 [tiny]", f"{NOT_COMPARABLE}: rtd_only was pretrained with preset study, not tiny"),
        ("Table 3 [study]", f"{NOT_COMPARABLE}: cocolm was pretrained with preset tiny, not study")}


def test_runs_of_different_budgets_are_not_comparable():
    study = runs(cocolm={}, electra={}, roberta_mlm={"mlm_accuracy": 0.15})
    study.loc[study["variant"] == "electra", "params.train.max_steps"] = "80"
    claims = judge(study, EMPTY_HISTORY, scores([(v, "SNLI", spread(0.8)) for v in ("cocolm", "electra", "roberta_mlm")]))
    table1 = [c for c in claims if c.source == "Table 1" and "fine-tuning" in c.statement]
    assert len(table1) == 2 and all(c.verdict.startswith(NOT_COMPARABLE) for c in table1)
    assert "electra: 80 steps of 32 x 64 tokens" in table1[0].verdict


def test_runs_computed_in_different_precisions_are_not_comparable():
    """A study resumed on a CPU without native bf16 runs the rest in fp32 (cocolm.precision): no verdict across."""
    study = runs(cocolm={}, electra={}, roberta_mlm={"mlm_accuracy": 0.15})
    study["precision"] = "bf16"
    finetuned = scores([("cocolm", "SNLI", spread(0.9)), ("electra", "SNLI", spread(0.5)),
                        ("roberta_mlm", "SNLI", spread(0.3))])
    assert verdict(judge(study, EMPTY_HISTORY, finetuned), TABLE1_ROW + ": SNLI") == HOLDS  # one precision
    study.loc[(study["variant"] == "electra") & (study["seed"] == "3"), "precision"] = "fp32"
    claims = [c for c in judge(study, EMPTY_HISTORY, finetuned) if c.source == "Table 1" and "fine-tuning" in c.statement]
    assert claims and all(c.verdict.startswith(NOT_COMPARABLE) for c in claims)
    assert "fp32: electra seed 3" in claims[0].verdict
    study["precision"] = ""  # runs older than the tag: not a difference
    assert verdict(judge(study, EMPTY_HISTORY, finetuned), TABLE1_ROW + ": SNLI") == HOLDS


def test_fig7_within_clm_only_compares_its_own_curves_paired():
    study = runs(clm_only={})
    hist = pd.concat([pd.concat([history(f"run-clm_only-{i}", "cls_negative_cosine", np.full(10, 0.95 - i / 10)),
                                 history(f"run-clm_only-{i}", "cls_positive_cosine", np.full(10, 0.90 - i / 10))])
                      for i in range(MIN_RUNS)])
    claim = by_statement(judge(study, hist, scores([])))[
        "without SCL, positive pairs are less similar than random negatives (clm_only)"]
    assert "paired" in claim.basis and claim.verdict == HOLDS  # runs differ by 0.1 each; every difference is 0.05


def test_the_scl_gain_over_label_fractions_compares_per_run_drops():
    study = runs(cocolm={}, clm_only={})
    fractions = scores([("cocolm", "SNLI:0.1", spread(0.70)), ("cocolm", "SNLI", spread(0.80, step=0.005)),
                        ("clm_only", "SNLI:0.1", spread(0.55)), ("clm_only", "SNLI", spread(0.78, step=0.005))])
    (claim,) = [c for c in judge(study, EMPTY_HISTORY, fractions) if c.source == "Fig. 7c/d"]
    assert claim.statement.endswith("SNLI, 0.1 vs 1 of the labels") and claim.verdict == HOLDS


def test_missing_runs_are_not_measured_with_the_reason():
    claims = judge(runs(cocolm={}), EMPTY_HISTORY, scores([]))
    assert verdict(claims, "random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA") == \
        "not measured: no electra pretraining run in the study"


def test_a_run_not_finished_is_never_a_recipe_failure():
    """A study stopped halfway (to be resumed) leaves a run KILLED or RUNNING: that says nothing about the
    recipe. Three trained runs and one stopped: not enough runs yet, naming the stopped one; a run that
    ended and failed the gate still makes it a recipe failure."""
    study = runs(cocolm={}, electra=[{}, {}, {}, {}])
    study.loc[study["run_id"] == "run-electra-3", "status"] = "KILLED"
    assert verdict(judge(study, EMPTY_HISTORY, scores([])), TABLE1_ROW) == (
        f"{FEW_RUNS} (electra: 3, at least {MIN_RUNS}; 1 not finished)")
    study = runs(cocolm={}, electra=[{}, {}, {"copy_accuracy_replaced": 0.0}, {}])
    study.loc[study["run_id"] == "run-electra-3", "status"] = "RUNNING"
    assert verdict(judge(study, EMPTY_HISTORY, scores([])), TABLE1_ROW) == (
        f"{RECIPE_FAILED} for electra (2 of 3 runs trained: replaced tokens found failed in 1; 1 not finished)")
    study.loc[study["run_id"] == "run-electra-3", "status"] = "FAILED"  # a crash is the recipe's
    assert verdict(judge(study, EMPTY_HISTORY, scores([])), TABLE1_ROW).startswith(
        f"{RECIPE_FAILED} for electra (2 of 4 runs trained: ")


def test_the_gate_table_lists_a_run_not_finished_as_that_alone():
    """A run stopped at step 650 of 3,000 fails criteria its finished run may pass: the table says "not
    finished", never the criteria its partial metrics miss."""
    study = runs(electra=[{}, {}, {}, {"copy_accuracy_replaced": 0.0, "aux_mlm_accuracy": 0.04}])
    study.loc[study["run_id"] == "run-electra-3", "status"] = "RUNNING"
    assert "| tiny | electra | 4 | 3 | not finished (1) |" in claims_markdown([], study)
