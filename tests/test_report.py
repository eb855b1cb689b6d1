"""analysis.report on synthetic runs in a tmp sqlite store: task medians, differences, missing values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.report import ablation_table, build, finetuning_table, score_markdown
from jobs.names import (KIND_PRETRAINING, KIND_SWEEP, KIND_TAG, PRECISION_TAG, PRETRAINING_SEED_TAG, PRETRAINING_TAG,
                        best_task_metric)
from jobs.run_tables import latest_per_seed, pretraining_runs
from jobs.tracking import experiment_id
from helpers import empty_store, fake_pretraining_run, fake_sweep_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path):
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    exp = experiment_id(client, "ablation-tiny", uri)
    acc = {"copy_accuracy_replaced": [0.2, 0.5], "copy_accuracy_original": [0.9, 0.95],
           "lm_accuracy_replaced": [0.1, 0.3], "lm_accuracy_original": [0.4, 0.6]}
    runs = {
        "cocolm": fake_pretraining_run(client, exp, "cocolm", {**acc, "scl_positive_cosine": [0.5, 0.8],
                                                       "scl_negative_cosine": [0.4, 0.2]}),
        "rtd_only": fake_pretraining_run(client, exp, "rtd_only", {k: v for k, v in acc.items() if k.startswith("copy")}),
        "clm_only": fake_pretraining_run(client, exp, "clm_only", acc),
    }
    fake_sweep_run(client, exp, runs["cocolm"], {"SNLI": 0.80, "RTE": 0.60})
    fake_sweep_run(client, exp, runs["rtd_only"], {"SNLI": 0.75})  # RTE never fine-tuned: missing, not 0
    fake_sweep_run(client, exp, runs["clm_only"], {"SNLI": 0.10, "RTE": 0.10}, status="FAILED")  # ignored
    fake_sweep_run(client, exp, runs["clm_only"], {"SNLI": 0.82, "RTE": 0.0})  # a real 0 stays a 0
    return uri, client, runs


def test_tables_medians_differences_and_missing_values(store, tmp_path):
    uri, client, runs = store
    report = build(client, "ablation-tiny", tmp_path / "out")
    table = report.finetuning.set_index("variant")
    assert table.loc["cocolm", "SNLI"] == pytest.approx(0.80) and table.loc["cocolm", "RTE"] == pytest.approx(0.60)
    assert table.loc["cocolm", "AVG"] == pytest.approx(0.70)
    assert np.isnan(table.loc["rtd_only", "RTE"]) and np.isnan(table.loc["rtd_only", "AVG"])
    assert table.loc["clm_only", "SNLI"] == pytest.approx(0.82)  # the failed sweep is not read
    assert table.loc["clm_only", "RTE"] == 0.0
    ablation = report.ablation.set_index("variant")
    assert list(report.ablation["variant"])[0] == "cocolm"  # the baseline row first
    assert ablation.loc["rtd_only", "SNLI diff"] == pytest.approx(-0.05)
    assert np.isnan(ablation.loc["rtd_only", "RTE diff"])  # missing - anything = missing
    assert ablation.loc["clm_only", "RTE diff"] == pytest.approx(-0.60)
    assert ablation.loc["cocolm", "SNLI diff"] == 0.0

    markdown = (tmp_path / "out" / "ablation_table.md").read_text()
    rtd_line = next(line for line in markdown.splitlines() if "| rtd_only |" in line)
    assert "75.00 (-5.00)" in rtd_line and "| - (-) |" in rtd_line and "0.00" not in rtd_line
    title = (tmp_path / "out" / "finetuning_table.md").read_text().splitlines()[0]
    assert "best dev median" in title and "the reported split: RTE dev, SNLI dev" in title  # old sweeps: dev
    csv = pd.read_csv(tmp_path / "out" / "finetuning_table.csv").set_index("variant")
    assert np.isnan(csv.loc["rtd_only", "RTE"])  # an empty cell, not 0
    for name in ("fig8_copy_lm_accuracy.png", "fig7_scl_cosine.png"):
        assert (tmp_path / "out" / name).stat().st_size > 10_000
    assert not (tmp_path / "out" / "fig1_cls_cosine.png").exists()  # jobs.studies.represent never ran here
    text = (tmp_path / "out" / "claims.md").read_text()
    gate_rows, claims = text.split("## The claims")[0], text.split("## The claims")[1].splitlines()
    assert "| tiny | rtd_only | 1 | 1 | - |" in gate_rows  # the gate table opens the file
    rows = [line for line in claims if line.startswith("| ") and "verdict" not in line]
    assert rows and all(line.rstrip().endswith("** |") for line in rows)  # a verdict on every row
    # one pretraining run a side: never a verdict, whatever its fine-tuning seeds say
    assert any("cocolm above rtd_only" in line and "**not enough pretraining runs (cocolm: 1, at least 4)**" in line
               for line in rows)
    per_run = pd.read_csv(tmp_path / "out" / "runs.csv").set_index("variant")  # one row per pretraining run
    assert per_run.loc["rtd_only", "gate"] == "trained" and per_run.loc["rtd_only", "SNLI"] == pytest.approx(0.75)


def test_the_runs_table_gives_each_runs_minutes_and_none_for_a_run_not_ended(store, tmp_path):
    """The time a study took, run by run (issue 33: commit the time taken): start to end in the store."""
    uri, client, runs = store
    exp = client.get_run(runs["cocolm"]).info.experiment_id
    tags = {KIND_TAG: KIND_PRETRAINING, "preset": "tiny", "variant": "electra"}
    timed = client.create_run(exp, start_time=1_000_000, tags={**tags, PRETRAINING_SEED_TAG: "0",
                                                              PRECISION_TAG: "fp32"}).info.run_id
    client.set_terminated(timed, end_time=1_000_000 + 90_000)
    live = client.create_run(exp, tags={**tags, PRETRAINING_SEED_TAG: "1"}).info.run_id  # still RUNNING
    build(client, "ablation-tiny", tmp_path / "out")
    per_run = pd.read_csv(tmp_path / "out" / "runs.csv").set_index("run_id")
    assert per_run.loc[timed, "minutes"] == pytest.approx(1.5)
    assert np.isnan(per_run.loc[live, "minutes"])  # not ended: missing, never 0 or negative
    assert (per_run.loc[list(runs.values()), "minutes"] >= 0).all()
    assert "| minutes | precision |" in (tmp_path / "out" / "runs.md").read_text()
    assert per_run.loc[timed, "precision"] == "fp32"  # the tag the job sets; a run without it: empty
    assert np.isnan(per_run.loc[live, "precision"])  # no tag (a run older than it): an empty cell


def test_the_timeline_lists_every_run_of_the_study_in_order_with_its_minutes_and_the_span(tmp_path):
    """timeline.md: the time a study took, from its runs alone: pretraining runs, the control, each sweep
    (with the variant and seed of the run it fine-tunes), in the order they started; a run not ended (one
    resumed after a failure included) has no minutes and is counted; the span runs from the first start to
    the last end."""
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    exp = experiment_id(client, "ablation-tiny", uri)
    t0 = 1_700_000_000_000  # 2023-11-14 22:13 UTC

    def run(kind: str, start_min: float, end_min: float | None, **tags: str) -> str:
        run_id = client.create_run(exp, start_time=t0 + int(start_min * 60_000), run_name=f"{kind}-{start_min}",
                                   tags={KIND_TAG: kind, **tags}).info.run_id
        if end_min is not None:
            client.set_terminated(run_id, end_time=t0 + int(end_min * 60_000))
        return run_id

    cocolm = run(KIND_PRETRAINING, 0, 30, variant="cocolm", preset="tiny", **{PRETRAINING_SEED_TAG: "3"})
    run(KIND_SWEEP, 31, 33.5, **{PRETRAINING_TAG: cocolm})
    run(KIND_PRETRAINING, 34, 34, variant="random_init", preset="tiny", **{PRETRAINING_SEED_TAG: "3"})
    live = run(KIND_PRETRAINING, 0.5, 20, variant="electra", preset="tiny", **{PRETRAINING_SEED_TAG: "3"})
    client.update_run(live, status="RUNNING")  # failed at minute 20, resumed: MLflow keeps that end time
    build(client, "ablation-tiny", tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "timeline.csv", dtype={"seed": str})
    assert list(table["variant"]) == ["cocolm", "electra", "cocolm", "random_init"]  # by start; the sweep's own
    assert list(table["kind"]) == [KIND_PRETRAINING, KIND_PRETRAINING, KIND_SWEEP, KIND_PRETRAINING]
    assert list(table["seed"]) == ["3"] * 4
    assert list(table["start (min)"]) == pytest.approx([0, 0.5, 31, 34])
    assert table["minutes"].iloc[[0, 2, 3]].tolist() == pytest.approx([30, 2.5, 0])
    assert np.isnan(table["minutes"].iloc[1])  # not ended: missing, never 0 or negative
    text = (tmp_path / "out" / "timeline.md").read_text()
    assert text.startswith("The study's runs in the order they started: 4 runs, 34.0 minutes from the first start "
                           "(2023-11-14 22:13 UTC) to the last end (2023-11-14 22:47 UTC); 1 not ended.")


def test_pretraining_metrics_show_the_comparable_ones_first_and_loss_last(store, tmp_path):
    uri, client, runs = store
    for variant, loss in (("cocolm", 39.0), ("rtd_only", 26.2)):  # the reported case: different sums
        client.log_metric(runs[variant], "loss", loss)
    build(client, "ablation-tiny", tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "pretraining_metrics.csv").set_index("variant")
    assert list(table.columns)[-1] == "loss" and list(table.columns)[0] == "copy_accuracy_replaced"
    assert table.loc["cocolm", "copy_accuracy_replaced"] == pytest.approx(0.5)
    assert np.isnan(table.loc["rtd_only", "lm_accuracy_replaced"])  # rtd_only has no LM head: missing, not 0
    markdown = (tmp_path / "out" / "pretraining_metrics.md").read_text()
    assert "loss (not comparable)" in markdown and "`loss` is each variant's own weighted sum" in markdown


def test_an_ablation_without_baseline_or_sweeps_has_missing_differences():
    runs = pd.DataFrame({"preset": ["tiny", "small"], "variant": ["rtd_only", "cocolm"], "run_name": ["a", "b"],
                         "run_id": ["1", "2"]})
    scores = pd.DataFrame({"pretraining_run": ["1", "2"], "task": ["SNLI", "SNLI"], "score": [0.7, 0.9]})
    ablation = ablation_table(finetuning_table(runs, scores)).set_index("variant")
    assert np.isnan(ablation.loc["rtd_only", "SNLI diff"])  # no cocolm run of the tiny preset
    empty = finetuning_table(runs, scores.iloc[:0])
    assert list(empty.columns) == ["preset", "variant", "seed", "run_name", "run_id", "AVG"] and empty["AVG"].isna().all()
    assert "| tiny | rtd_only |  | a |" in score_markdown(ablation_table(empty), with_diffs=True)


def test_glue_average_needs_all_eight_targets_and_skips_mnli_mm():
    glue = {"MNLI-m": 0.8, "MNLI-mm": 0.0, "QQP": 0.8, "QNLI": 0.8, "SST-2": 0.8, "CoLA": 0.8, "RTE": 0.8,
            "MRPC": 0.8, "STS-B": 0.8}
    runs = pd.DataFrame({"preset": ["base"] * 2, "variant": ["cocolm", "rtd_only"], "run_name": ["a", "b"],
                         "run_id": ["1", "2"]})
    scores = pd.DataFrame([{"pretraining_run": "1", "task": t, "score": s} for t, s in glue.items()]
                          + [{"pretraining_run": "2", "task": t, "score": s} for t, s in glue.items() if t != "CoLA"])
    table = finetuning_table(runs, scores)
    assert list(table.columns[5:8]) == ["MNLI-m", "MNLI-mm", "QQP"]  # the paper's column order
    assert table.loc[0, "AVG"] == pytest.approx(0.8) and np.isnan(table.loc[1, "AVG"])


def test_the_newest_finished_run_per_variant_is_reported(tmp_path):
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    exp = experiment_id(client, "x", uri)
    old = fake_pretraining_run(client, exp, "cocolm", {})
    new = fake_pretraining_run(client, exp, "cocolm", {})
    client.create_run(exp, tags={"kind": "pretraining", "preset": "tiny", "variant": "cocolm"})  # still running
    chosen = latest_per_seed(pretraining_runs(client, [exp]))
    assert list(chosen["run_id"]) == [new] and old != new


def test_the_command_logs_an_analysis_run_and_imports_no_torch(store, tmp_path):
    uri, client, _ = store
    code = ("import sys, runpy; sys.argv = ['report', '--experiment', 'ablation-tiny', '--tracking-uri', "
            f"{uri!r}, '--out', {str(tmp_path / 'cli')!r}]; runpy.run_module('analysis.report', run_name='__main__');"
            "assert 'torch' not in sys.modules, 'analysis must not import torch'")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| tiny | rtd_only |" in out.stdout
    exp = client.get_experiment_by_name("ablation-tiny").experiment_id
    analysis = client.search_runs([exp], filter_string="tags.kind = 'analysis'")
    assert len(analysis) == 1 and analysis[0].info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(analysis[0].info.run_id)}
    assert {"finetuning_table.md", "ablation_table.csv", "fig8_copy_lm_accuracy.png", "fig7_scl_cosine.png"} <= artifacts


def test_representation_figure_from_logged_cosines(store, tmp_path):
    uri, client, runs = store
    rng = np.random.default_rng(0)
    for variant, centre in (("cocolm", 0.1), ("rtd_only", 0.9)):
        cos = pd.DataFrame({"kind": ["random"] * 50 + ["similar"] * 50,
                            "cosine": np.r_[rng.normal(centre, 0.05, 50), rng.normal(0.95, 0.02, 50)]})
        client.log_text(runs[variant], cos.to_csv(index=False), "represent/cosines.csv")
        client.log_metric(runs[variant], "represent/random_cosine_mean", cos[cos.kind == "random"].cosine.mean())
        client.log_metric(runs[variant], "represent/similar_cosine_mean", cos[cos.kind == "similar"].cosine.mean())
        client.log_metric(runs[variant], "represent/cosine_gap", 0.5)
    report = build(client, None, tmp_path / "out")
    assert (tmp_path / "out" / "fig1_cls_cosine.png") in report.files
    summary = pd.read_csv(tmp_path / "out" / "representation.csv").set_index("variant")
    assert set(summary.index) == {"cocolm", "rtd_only"}
    assert summary.loc["cocolm", "random_cosine_mean"] == pytest.approx(0.1, abs=0.05)


def test_squad_gets_em_and_f1_columns_and_stays_out_of_the_average(tmp_path):
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    exp = experiment_id(client, "squad", uri)
    pretraining = fake_pretraining_run(client, exp, "cocolm", {"copy_accuracy_original": [0.9]})
    sweep = fake_sweep_run(client, exp, pretraining, {"SQuAD 2.0": 0.70, "RTE": 0.60, "SNLI": 0.80}, status="RUNNING")
    client.log_metric(sweep, best_task_metric("SQuAD 2.0", "exact_median"), 0.65)  # as the sweep logs EM
    client.set_terminated(sweep)
    report = build(client, "squad", tmp_path / "out")
    row = report.finetuning.iloc[0]
    assert [c for c in report.finetuning.columns if "SQuAD" in c] == ["SQuAD 2.0 EM", "SQuAD 2.0 F1"]
    assert row["SQuAD 2.0 EM"] == pytest.approx(0.65) and row["SQuAD 2.0 F1"] == pytest.approx(0.70)
    assert row["AVG"] == pytest.approx(0.70)  # RTE and SNLI only
    assert "| 65.00 | 70.00 |" in (tmp_path / "out" / "finetuning_table.md").read_text()


def test_label_fractions_get_their_table_figure_and_claim_and_stay_out_of_table_1(tmp_path):
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    exp = experiment_id(client, "fractions", uri)
    # Four pretraining runs a variant. SCL gain: about +0.06 at 1% of the labels, +0.01 with all of them.
    for seed, wobble in enumerate((-0.006, -0.002, 0.002, 0.006)):
        runs = {v: fake_pretraining_run(client, exp, v, {"copy_accuracy_original": [0.9]}, seed=seed)
                for v in ("cocolm", "clm_only")}
        fake_sweep_run(client, exp, runs["cocolm"], {"SNLI:0.01": 0.50 + wobble, "SNLI:0.1": 0.60, "SNLI": 0.70},
                       spread=0.01)
        fake_sweep_run(client, exp, runs["clm_only"], {"SNLI:0.01": 0.44 - wobble, "SNLI:0.1": 0.57,
                                                       "SNLI": 0.69 + wobble / 2}, spread=0.01)
    report = build(client, "fractions", tmp_path / "out")
    assert [c for c in report.finetuning.columns if "SNLI" in c] == ["SNLI"]  # Table 1: all the labels only
    assert len(report.finetuning) == 8  # every pretraining run, each seed its own row
    table = pd.read_csv(tmp_path / "out" / "label_fractions.csv")
    cocolm = table[(table["variant"] == "cocolm") & (table["seed"] == 1)]
    assert list(cocolm["fraction"]) == [0.01, 0.1, 1.0] and list(cocolm["score"]) == pytest.approx([0.498, 0.60, 0.70])
    assert list(cocolm["min"]) == pytest.approx([0.488, 0.59, 0.69])
    assert (tmp_path / "out" / "fig7cd_label_fractions.png").stat().st_size > 10_000
    markdown = (tmp_path / "out" / "label_fractions.md").read_text()
    assert "x100" in markdown and "| 49.80 | 48.80 | 50.80 |" in markdown  # the scale of every other score table
    claim = next(c for c in report.claims if c.source == "Fig. 7c/d")
    assert claim.verdict == "holds" and "4 vs 4 pretraining runs" in claim.basis
    assert "score at 0.01 minus at 1 of the labels, mean over runs: cocolm -0.200, clm_only -0.250" in claim.numbers
    table3 = [c for c in report.claims if c.statement.startswith("SCL helps (cocolm above clm_only)")]
    assert [c.statement for c in table3] == ["SCL helps (cocolm above clm_only): SNLI"]  # Table 3 reads all the labels
    assert "cocolm 0.700, clm_only 0.690" in table3[0].numbers


def test_curves_of_13_variants_each_keep_one_distinct_colour_and_marker_in_every_panel(tmp_path, monkeypatch):
    import analysis.report as report

    names = ["cocolm", "electra", "roberta_mlm", "rtd_only", "clm_only", "scl_rtd", "no_rel_pos", "electra_aux",
             "random_replace", "all_token_lm", "clm_no_copy", "clm_no_stopgrad", "converged_aux"]
    labels = {f"run-{v}": f"{v} (tiny)" for v in names}
    keys = [k for panel in report.FIG8 for k in panel[1:]]
    hist = pd.DataFrame([{"run_id": r, "key": k, "step": s, "value": s / 100} for r in labels for k in keys
                         for s in (0, 50, 100)])
    drawn = {}
    monkeypatch.setattr(report, "save", lambda fig, title, path, bottom=0.0: drawn.setdefault("fig", fig))
    report.curves_figure(hist, labels, report.FIG8, "t", tmp_path / "f.png", "accuracy")
    fig = drawn["fig"]
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == 2 and not any(ax.get_legend() for ax in panels) and len(fig.legends) == 1
    looks = {}  # label -> every (colour, marker) its lines were drawn with, over both panels and both keys
    for ax in panels:
        for line in ax.lines:
            looks.setdefault(line.get_label(), set()).add((line.get_color(), line.get_marker()))
    assert sorted(looks) == sorted(labels.values()) and all(len(look) == 1 for look in looks.values())
    assert len({next(iter(look)) for look in looks.values()}) == 13  # no two variants look alike
    assert len({next(iter(look))[0] for look in looks.values()}) == 13  # not even by colour alone


def test_a_curve_figure_names_every_run_without_its_curves_in_lines_as_wide_as_the_figure(tmp_path, monkeypatch):
    """A 4-seed study: the MLM baseline's and the controls' runs log no Fig. 8 curve; the title names each of
    them, wrapped so that no line is wider than the figure (one line of 8 runs ran off both edges)."""
    import analysis.report as report

    logged = {f"run-cocolm-{s}": f"cocolm s{s} (study-cpu)" for s in range(4)}
    silent = {f"run-{v}-{s}": f"{v} s{s} (study-cpu)" for v in ("roberta_mlm", "random_init") for s in range(4)}
    keys = [k for panel in report.FIG8 for k in panel[1:]]
    hist = pd.DataFrame([{"run_id": r, "key": k, "step": s, "value": s / 100} for r in logged for k in keys
                         for s in (0, 50, 100)])
    drawn = {}
    monkeypatch.setattr(report, "save", lambda fig, title, path, bottom=0.0: drawn.update(fig=fig, title=title))
    report.curves_figure(hist, {**logged, **silent}, report.FIG8, "Fig. 8", tmp_path / "f.png", "accuracy")
    title = drawn["title"]
    assert all(label in title.replace("\n", " ") for label in silent.values())
    assert not any(label in title for label in logged.values())
    assert max(len(line) for line in title.splitlines()) <= 10 * drawn["fig"].get_figwidth()
    assert len(title.splitlines()) >= 3  # the title and the note over at least two lines


def test_the_gate_curves_show_every_run_of_a_variant_its_bounds_and_how_many_trained(tmp_path, monkeypatch):
    """gate_curves.png: a panel per variant (none for the control), a line per run and gated accuracy in its
    seed's colour, the bounds dotted, "k of n trained" in the title, from the same rules as the gate table."""
    import analysis.report as report
    from jobs.gate import PLATEAU_BOUND

    def run(variant, seed, aux, copy=None):
        metrics = {"metrics.aux_mlm_accuracy": aux, "metrics.represent/random_cosine_mean": 0.9}
        if copy is not None:
            metrics["metrics.copy_accuracy_replaced"] = copy
        return {"run_id": f"{variant}-{seed}", "preset": "p", "variant": variant, "seed": str(seed),
                "status": "FINISHED", "params.objective.use_copy_loss": str(copy is not None), **metrics}

    runs = pd.DataFrame([run("cocolm", 0, 0.12, 0.10), run("cocolm", 1, 0.12, 0.02), run("electra", 0, 0.03),
                         run("electra", 1, 0.11), {"run_id": "control-0", "preset": "p", "variant": "random_init",
                                                   "seed": "0", "status": "FINISHED"}])
    last = {f"{r['run_id']}|{k.removeprefix('metrics.')}": v for _, r in runs.iterrows() for k, v in r.items()
            if k.startswith("metrics.") and pd.notna(v)}
    hist = pd.DataFrame([{"run_id": key.split("|")[0], "key": key.split("|")[1], "step": s, "value": v * s / 100}
                         for key, v in last.items() for s in (50, 100)])
    drawn = {}
    monkeypatch.setattr(report, "save", lambda fig, title, path, bottom=0.0: drawn.setdefault("fig", fig))
    report.gate_curves_figure(runs, hist, tmp_path / "g.png")
    panels = {ax.get_title(): ax for ax in drawn["fig"].axes if ax.get_visible()}
    assert sorted(panels) == ["cocolm (p): 1 of 2 trained", "electra (p): 1 of 2 trained"]  # no control panel
    cocolm, electra = panels["cocolm (p): 1 of 2 trained"], panels["electra (p): 1 of 2 trained"]
    curves = lambda ax: [line.get_linestyle() for line in ax.lines if line.get_linestyle() != ":"]
    assert sorted(curves(cocolm)) == ["-", "-", "--", "--"]  # 2 runs x (aux, copy)
    bounds = sorted(line.get_ydata()[0] for line in cocolm.lines if line.get_linestyle() == ":")
    assert bounds == [0.05, PLATEAU_BOUND]
    assert curves(electra) == ["-", "-"]  # electra here logs no copy accuracy
    colours = lambda ax: {line.get_color() for line in ax.lines if line.get_linestyle() == "-"}
    assert colours(cocolm) == colours(electra) and len(colours(cocolm)) == 2  # one colour a seed, in every panel
    assert report.gate_curves_figure(runs, hist[hist["key"] == "loss"], tmp_path / "none.png") is None
