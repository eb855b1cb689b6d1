"""analysis.claims: each claim's verdict from hand-made runs, histories and fine-tuning scores."""

import pandas as pd

from analysis.claims import FAILS, HOLDS, NOISE, claims_markdown, judge


def runs(**metrics_by_variant: dict) -> pd.DataFrame:
    rows = [{"run_id": f"run-{v}", "variant": v, "preset": "tiny", "params.train.max_steps": "40",
             **{f"metrics.{k}": x for k, x in m.items()}} for v, m in metrics_by_variant.items()]
    return pd.DataFrame(rows)


def history(run_id: str, key: str, values: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"run_id": run_id, "key": key, "step": range(5, 5 * len(values) + 1, 5), "value": values})


def scores(rows: list[tuple[str, str, float, float, float]]) -> pd.DataFrame:
    """(variant, task, median, min, max) with 5 seeds."""
    return pd.DataFrame([{"pretraining_run": f"run-{v}", "task": t, "score": m, "min": lo, "max": hi, "seeds": 5}
                         for v, t, m, lo, hi in rows],
                        columns=["pretraining_run", "task", "score", "min", "max", "seeds"])


def verdicts(claims) -> dict[str, str]:
    return {c.statement: c.verdict for c in claims}


COCOLM = {"represent/random_cosine_mean": 0.30, "represent/cosine_gap": 0.25, "copy_accuracy_original": 0.97,
          "scl_positive_cosine": 0.85, "scl_negative_cosine": 0.05}


def test_verdicts_follow_the_numbers_and_the_seed_spread():
    study = runs(cocolm=COCOLM, electra={"represent/random_cosine_mean": 0.90}, roberta_mlm={}, rtd_only={},
                 all_token_lm={})
    hist = pd.concat([history("run-cocolm", "copy_accuracy_replaced", [0.0, 0.1, 0.3, 0.5, 0.6]),
                      history("run-cocolm", "lm_accuracy_replaced", [0.2, 0.25, 0.19, 0.21, 0.2])])
    finetuned = scores([
        ("cocolm", "SNLI", 0.80, 0.78, 0.82), ("rtd_only", "SNLI", 0.70, 0.69, 0.72),  # apart: holds
        ("all_token_lm", "SNLI", 0.81, 0.79, 0.83),  # above, but the seeds overlap: within noise
        ("electra", "SNLI", 0.75, 0.74, 0.76), ("roberta_mlm", "SNLI", 0.77, 0.765, 0.775),  # electra < roberta
    ])
    v = verdicts(judge(study, hist, finetuned))
    assert v["random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA"] == HOLDS
    assert v["similar pairs score above random pairs (COCO-LM: cosine gap > 0)"] == HOLDS
    assert v["copy accuracy on original tokens is high (>= 0.9)"] == HOLDS
    assert v["copy accuracy on replaced tokens rises during pretraining"] == HOLDS
    assert v["LM accuracy on replaced tokens rises during pretraining"] == NOISE  # flat within its own wobble
    assert v["SCL positive-pair cosine is high (>= 0.8)"] == HOLDS
    assert v["SCL negative-pair cosine is near 0 (|cos| <= 0.2)"] == HOLDS
    assert v["COCO-LM is at least rtd_only (fine-tuning median)"] == HOLDS
    assert v["COCO-LM is at least all_token_lm (fine-tuning median)"] == NOISE
    table1 = "at equal pretraining steps: COCO-LM above ELECTRA above RoBERTa (fine-tuning median)"
    assert v[f"{table1}: cocolm >= electra"] == HOLDS
    assert v[f"{table1}: electra >= roberta_mlm"] == FAILS


def test_missing_runs_are_not_measured_with_the_reason():
    claims = judge(runs(rtd_only={}), pd.DataFrame(columns=["run_id", "key", "step", "value"]),
                   scores([("rtd_only", "SNLI", 0.7, 0.7, 0.7)]))
    assert all(c.verdict.startswith("not measured: ") for c in claims)
    reasons = {c.verdict for c in claims}
    assert "not measured: no cocolm pretraining run in the study" in reasons
    assert any("represent/random_cosine_mean" in r for r in reasons)


def test_tiny_collapsed_runs_are_within_noise_not_a_win():
    """At tiny scale every [CLS] cosine is 1.000: the comparison is honest noise, not a verdict."""
    study = runs(cocolm={**COCOLM, "represent/random_cosine_mean": 1.0}, electra={"represent/random_cosine_mean": 1.0})
    v = verdicts(judge(study, pd.DataFrame(columns=["run_id", "key", "step", "value"]), scores([])))
    assert v["random-pair [CLS] cosine is lower for COCO-LM than for ELECTRA"] == NOISE


def test_different_pretraining_steps_are_not_compared():
    study = runs(cocolm=COCOLM, electra={}, roberta_mlm={})
    study.loc[study["variant"] == "electra", "params.train.max_steps"] = "80"
    claims = judge(study, pd.DataFrame(columns=["run_id", "key", "step", "value"]), scores([]))
    (table1,) = [c for c in claims if c.source == "Table 1"]
    assert table1.verdict == "not measured: the three were pretrained for different steps"


def test_markdown_has_one_row_per_claim_with_its_verdict():
    claims = judge(runs(cocolm=COCOLM), history("run-cocolm", "copy_accuracy_replaced", [0.1, 0.5]), scores([]))
    markdown = claims_markdown(claims)
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and "verdict" not in line]
    assert len(rows) == len(claims) and all("**" in row for row in rows)
