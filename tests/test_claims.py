"""analysis.claims: each rule of the verdicts on hand-made runs, histories and per-seed scores."""

import numpy as np
import pandas as pd
import pytest

from analysis.claims import (FAILS, FEW_SEEDS, HOLDS, NOISE, NOT_COMPARABLE, claims_markdown, judge,
                             median_difference, summary_verdict)

EMPTY_HISTORY = pd.DataFrame(columns=["run_id", "key", "step", "value"])
SEEDS = (0, 1, 2, 3, 4)


def runs(preset: str = "tiny", steps: str = "40", **metrics_by_variant: dict) -> pd.DataFrame:
    rows = [{"run_id": f"run-{v}", "variant": v, "preset": preset, "params.train.max_steps": steps,
             "params.train.global_batch": "32", "params.data.seq_len": "64", "stopped": "",
             **{f"metrics.{k}": x for k, x in m.items()}} for v, m in metrics_by_variant.items()]
    return pd.DataFrame(rows)


def history(variant: str, key: str, values) -> pd.DataFrame:
    return pd.DataFrame({"run_id": f"run-{variant}", "key": key, "step": range(10, 10 * len(values) + 1, 10),
                         "value": list(values)})


def scores(rows: list[tuple[str, str, tuple[float, ...]]]) -> pd.DataFrame:
    """(variant, task, per-seed scores) -> sweep_scores' columns."""
    return pd.DataFrame([{"pretraining_run": f"run-{v}", "task": t, "score": float(np.median(s)), "min": min(s),
                          "max": max(s), "values": tuple(s), "seeds": len(s)} for v, t, s in rows],
                        columns=["pretraining_run", "task", "score", "min", "max", "values", "seeds"])


def around(centre: float, spread: float = 0.01) -> tuple[float, ...]:
    """Five seeds' scores around `centre`."""
    return tuple(centre + spread * d for d in (-1.0, -0.5, 0.0, 0.5, 1.0))


def by_statement(claims) -> dict[str, object]:
    return {c.statement: c for c in claims}


def verdict(claims, statement: str) -> str:
    return by_statement(claims)[statement].verdict


def test_the_median_difference_and_its_interval():
    separated = median_difference(around(0.80), around(0.70))
    assert separated.value == pytest.approx(0.10) and 0 < separated.low <= separated.value <= separated.high
    assert separated.verdict == HOLDS and median_difference(around(0.70), around(0.80)).verdict == FAILS
    overlapping = median_difference(around(0.80, 0.05), around(0.79, 0.05))
    assert overlapping.low < 0 < overlapping.high and overlapping.verdict == NOISE


@pytest.mark.parametrize("n", [1, 2])
def test_fewer_than_three_seeds_is_never_a_verdict(n):
    """One seed each used to "hold" on a 0.01 difference (min = max, so no overlap)."""
    study = runs(cocolm={}, rtd_only={})
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", (0.81,) * n), ("rtd_only", "SNLI", (0.80,) * n)]))
    claim = by_statement(claims)["cocolm above rtd_only: SNLI"]
    assert claim.verdict == FEW_SEEDS and f"{n} vs {n} seeds" in claim.basis


def test_three_separated_seeds_hold_and_the_interval_is_printed():
    study = runs(cocolm={}, rtd_only={})
    claims = judge(study, EMPTY_HISTORY, scores([("cocolm", "SNLI", (0.80, 0.81, 0.82)),
                                                 ("rtd_only", "SNLI", (0.70, 0.71, 0.72))]))
    claim = by_statement(claims)["cocolm above rtd_only: SNLI"]
    assert claim.verdict == HOLDS and "difference +10.00 [" in claim.numbers and "bootstrap" in claim.basis


def test_overlapping_seeds_are_within_noise_and_a_clear_loss_does_not_hold():
    study = runs(cocolm={}, all_token_lm={}, rtd_only={})
    claims = judge(study, EMPTY_HISTORY, scores([
        ("cocolm", "SNLI", around(0.80, 0.05)), ("all_token_lm", "SNLI", around(0.81, 0.05)),
        ("rtd_only", "SNLI", around(0.97, 0.01))]))
    assert verdict(claims, "cocolm above all_token_lm: SNLI") == NOISE
    assert verdict(claims, "cocolm above rtd_only: SNLI") == FAILS


def test_a_task_going_the_other_way_is_named_in_the_summary_and_tasks_are_never_averaged():
    """cocolm wins SNLI by far and loses CoLA (another metric) by a little: a mean would say "holds"."""
    study = runs(cocolm={}, rtd_only={})
    claims = judge(study, EMPTY_HISTORY, scores([
        ("cocolm", "SNLI", around(0.90)), ("rtd_only", "SNLI", around(0.60)),
        ("cocolm", "CoLA", around(0.30, 0.001)), ("rtd_only", "CoLA", around(0.32, 0.001))]))
    summary = by_statement(claims)["cocolm above rtd_only: all 2 tasks"]
    assert summary.verdict == "mixed: does not hold on CoLA; holds on SNLI"
    assert "never averaged" in summary.numbers
    assert summary_verdict({"A": HOLDS, "B": HOLDS}) == HOLDS


def test_relative_positions_are_judged_on_mnli_only():
    study = runs(cocolm={}, no_rel_pos={})
    snli_only = scores([("cocolm", "SNLI", around(0.90)), ("no_rel_pos", "SNLI", around(0.60))])
    (claim,) = [c for c in judge(study, EMPTY_HISTORY, snli_only) if "no_rel_pos" in c.statement]
    assert claim.verdict.startswith("not measured") and "MNLI-m" in claim.verdict  # the SNLI win is not its claim
    with_mnli = pd.concat([snli_only, scores([("cocolm", "MNLI-m", around(0.80)), ("no_rel_pos", "MNLI-m",
                                                                                     around(0.70))])])
    mine = [c for c in judge(study, EMPTY_HISTORY, with_mnli) if "no_rel_pos" in c.statement]
    assert [(c.statement.rsplit(": ", 1)[1], c.verdict) for c in mine] == [("MNLI-m", HOLDS)]


def test_scl_is_judged_on_rte_and_mrpc_where_the_paper_claims_it():
    study = runs(cocolm={}, clm_only={})
    claims = judge(study, EMPTY_HISTORY, scores([
        ("cocolm", "RTE", around(0.70)), ("clm_only", "RTE", around(0.60)),
        ("cocolm", "SNLI", around(0.80)), ("clm_only", "SNLI", around(0.80))]))
    scl = [c for c in claims if c.statement.startswith("SCL helps RTE and MRPC")]
    assert [(c.statement.rsplit(": ", 1)[1], c.verdict) for c in scl] == [("RTE", HOLDS)]


def test_runs_of_another_preset_are_not_comparable_and_the_reason_says_so():
    study = pd.concat([runs(cocolm={}), runs(preset="study", rtd_only={})])
    finetuned = scores([("cocolm", "SNLI", around(0.9)), ("rtd_only", "SNLI", around(0.5))])
    claims = [c for c in judge(study, EMPTY_HISTORY, finetuned) if c.statement == "cocolm above rtd_only"]
    assert {(c.source, c.verdict) for c in claims} == {
        ("Table 3 [tiny]", f"{NOT_COMPARABLE}: rtd_only was pretrained with preset study, not tiny"),
        ("Table 3 [study]", f"{NOT_COMPARABLE}: cocolm was pretrained with preset tiny, not study")}


def test_runs_of_different_budgets_are_not_comparable():
    study = runs(cocolm={}, electra={}, roberta_mlm={})
    study.loc[study["variant"] == "electra", "params.train.max_steps"] = "80"
    claims = judge(study, EMPTY_HISTORY, scores([(v, "SNLI", around(0.8)) for v in ("cocolm", "electra", "roberta_mlm")]))
    table1 = [c for c in claims if c.source == "Table 1"]
    assert len(table1) == 2 and all(c.verdict.startswith(NOT_COMPARABLE) for c in table1)
    assert "electra: 80 steps of 32 x 64 tokens" in table1[0].verdict


def test_clm_setup_rows_are_judged_against_clm_only():
    """clm_no_copy is an ablation of clm_only: below clm_only (holds) though above cocolm (never asked)."""
    study = runs(cocolm={}, clm_only={}, clm_no_copy={})
    claims = judge(study, EMPTY_HISTORY, scores([
        ("cocolm", "SNLI", around(0.60)), ("clm_only", "SNLI", around(0.90)), ("clm_no_copy", "SNLI", around(0.75))]))
    assert verdict(claims, "CLM setup: clm_only above clm_no_copy: SNLI") == HOLDS
    assert not [c for c in claims if c.statement.startswith("cocolm above clm_no_copy")]


def test_the_stop_gradient_is_judged_on_stability():
    statement = "without the stop-gradient training is less stable (clm_no_stopgrad vs clm_only)"
    rng = np.random.default_rng(0)
    calm = 5 - np.linspace(0, 1, 40) + 0.01 * rng.standard_normal(40)
    shaky = 5 - np.linspace(0, 1, 40) + 0.30 * rng.standard_normal(40)
    study = runs(clm_only={}, clm_no_stopgrad={})
    hist = pd.concat([history("clm_only", "loss", calm), history("clm_no_stopgrad", "loss", shaky)])
    assert verdict(judge(study, hist, scores([])), statement) == HOLDS
    swapped = pd.concat([history("clm_only", "loss", shaky), history("clm_no_stopgrad", "loss", calm)])
    assert verdict(judge(study, swapped, scores([])), statement) == FAILS
    study.loc[study["variant"] == "clm_no_stopgrad", "stopped"] = "non-finite loss at step 120"
    claim = by_statement(judge(study, EMPTY_HISTORY, scores([])))[statement]
    assert claim.verdict == HOLDS and "non-finite loss at step 120" in claim.numbers
    # and never on accuracy
    claims = judge(study, EMPTY_HISTORY, scores([("clm_only", "SNLI", around(0.5)), ("clm_no_stopgrad", "SNLI",
                                                                                       around(0.9))]))
    assert not [c for c in claims if "clm_no_stopgrad" in c.statement and c.source != "Table 3"]
    assert [c.statement for c in claims if "clm_no_stopgrad" in c.statement] == [statement]


def test_the_claims_that_could_not_fail_are_gone():
    """A head calling every token original scores 1.0 on original tokens, and SCL's cosines pass their old
    thresholds by step 300: none of these is a claim any more."""
    statements = " ".join(c.statement for c in judge(runs(cocolm={}), EMPTY_HISTORY, scores([])))
    assert "original tokens is high" not in statements and ">= 0.8" not in statements and "<= 0.2" not in statements


def test_fig8_compares_clm_with_all_token_lm_on_replaced_tokens():
    statement = "CLM (clm_only) finds replaced tokens better than All-Token LM (copy accuracy on replaced tokens)"
    study = runs(clm_only={}, all_token_lm={})
    rising = np.linspace(0.0, 0.5, 20)
    good = pd.concat([history("clm_only", "copy_accuracy_replaced", rising),
                      history("all_token_lm", "copy_accuracy_replaced", rising / 5)])
    claim = by_statement(judge(study, good, scores([])))[statement]
    assert claim.verdict == HOLDS and "1 run each" in claim.basis and "last fifth" in claim.basis
    bad = pd.concat([history("clm_only", "copy_accuracy_replaced", rising / 5),
                     history("all_token_lm", "copy_accuracy_replaced", rising)])
    assert verdict(judge(study, bad, scores([])), statement) == FAILS


def test_fig7_compares_cls_cosines_with_and_without_scl():
    study = runs(cocolm={}, clm_only={})
    hist = pd.concat([history("cocolm", "cls_positive_cosine", np.full(20, 0.95) + np.linspace(0, 0.01, 20)),
                      history("clm_only", "cls_positive_cosine", np.full(20, 0.50) + np.linspace(0, 0.01, 20)),
                      history("cocolm", "cls_negative_cosine", np.full(20, 0.05) + np.linspace(0, 0.01, 20)),
                      history("clm_only", "cls_negative_cosine", np.full(20, 0.70) + np.linspace(0, 0.01, 20))])
    claims = judge(study, hist, scores([]))
    assert verdict(claims, "SCL raises the positive pairs' [CLS] cosine (cocolm vs clm_only)") == HOLDS
    assert verdict(claims, "SCL lowers the negative pairs' [CLS] cosine (less degeneration)") == HOLDS
    assert verdict(claims, "without SCL, positive pairs are less similar than random negatives (clm_only)") == HOLDS
    flat = history("cocolm", "cls_positive_cosine", [0.5] * 20)
    assert verdict(judge(study, pd.concat([flat, hist[hist["run_id"] == "run-clm_only"]]), scores([])),
                   "SCL raises the positive pairs' [CLS] cosine (cocolm vs clm_only)") == FAILS


def pair_cosines(random: float, similar: float, n: int = 50) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame({"kind": ["random"] * n + ["similar"] * n,
                         "cosine": np.r_[random + 0.02 * rng.standard_normal(n), similar + 0.02 * rng.standard_normal(n)]})


def test_representation_claims_test_over_sentence_pairs():
    study = runs(cocolm={}, electra={}, clm_only={})
    pairs = {"run-cocolm": pair_cosines(0.10, 0.60), "run-electra": pair_cosines(0.90, 0.92),
             "run-clm_only": pair_cosines(0.50, 0.60)}
    claims = judge(study, EMPTY_HISTORY, scores([]), pairs=pairs)
    assert verdict(claims, "random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA") == HOLDS
    assert verdict(claims, "COCO-LM: similar pairs have higher [CLS] cosine than random pairs") == HOLDS
    assert verdict(claims, "similar pairs are more aligned with SCL (cocolm) than without (clm_only)") == NOISE
    assert "50 vs 50 sentence pairs" in by_statement(claims)["COCO-LM: similar pairs have higher [CLS] cosine than "
                                                             "random pairs"].basis
    collapsed = {"run-cocolm": pair_cosines(1.0, 1.0) .assign(cosine=1.0), "run-electra": pair_cosines(1, 1).assign(cosine=1.0)}
    assert verdict(judge(study, EMPTY_HISTORY, scores([]), pairs=collapsed),
                   "random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA") == NOISE


def test_table4_is_judged_over_the_few_shot_splits():
    study = runs(cocolm={}, roberta_mlm={})
    fewshot = pd.DataFrame([
        {"pretraining_run": "run-cocolm", "task": "SNLI", "method": "prompt", "values": around(0.60)},
        {"pretraining_run": "run-cocolm", "task": "SNLI", "method": "head", "values": around(0.40)},
        {"pretraining_run": "run-roberta_mlm", "task": "SNLI", "method": "prompt", "values": (0.7, 0.7)}])
    claims = judge(study, EMPTY_HISTORY, scores([]), fewshot=fewshot)
    assert verdict(claims, "COCO-LM: prompt-based fine-tuning above the [CLS] head: SNLI") == HOLDS
    claim = by_statement(claims)["prompt-based few-shot: COCO-LM above RoBERTa: SNLI"]
    assert claim.verdict == FEW_SEEDS and "5 vs 2 splits" in claim.basis


def test_the_scl_gain_over_label_fractions_rests_on_the_seeds():
    study = runs(cocolm={}, clm_only={})
    finetuned = scores([("cocolm", "SNLI:0.01", around(0.60)), ("clm_only", "SNLI:0.01", around(0.50)),
                        ("cocolm", "SNLI", around(0.80)), ("clm_only", "SNLI", around(0.79))])
    (claim,) = [c for c in judge(study, EMPTY_HISTORY, finetuned) if c.source == "Fig. 7c/d"]
    assert claim.verdict == HOLDS and "+10.00 at 0.01" in claim.numbers and "+1.00 at 1" in claim.numbers
    flat = scores([("cocolm", "SNLI:0.01", around(0.60, 0.1)), ("clm_only", "SNLI:0.01", around(0.59, 0.1)),
                   ("cocolm", "SNLI", around(0.80)), ("clm_only", "SNLI", around(0.80))])
    (claim,) = [c for c in judge(study, EMPTY_HISTORY, flat) if c.source == "Fig. 7c/d"]
    assert claim.verdict == NOISE


def test_missing_runs_are_not_measured_with_the_reason():
    claims = judge(runs(rtd_only={}), EMPTY_HISTORY, scores([("rtd_only", "SNLI", around(0.7))]))
    assert all(c.verdict.startswith("not measured: ") for c in claims)
    assert "not measured: no cocolm pretraining run in the study" in {c.verdict for c in claims}


def test_markdown_has_one_row_per_claim_and_counts_the_verdicts():
    claims = judge(runs(cocolm={}, rtd_only={}), EMPTY_HISTORY,
                   scores([("cocolm", "SNLI", around(0.8)), ("rtd_only", "SNLI", around(0.7))]))
    markdown = claims_markdown(claims)
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and "verdict" not in line]
    assert len(rows) == len(claims) and all(row.rstrip().endswith("** |") for row in rows)
    assert "Verdicts: " in markdown and "1 holds" in markdown
