"""analysis.report on synthetic runs in a tmp sqlite store: task medians, differences, missing values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from analysis.report import ablation_table, build, finetuning_table, score_markdown
from jobs.runs import latest_per_variant, pretraining_runs
from jobs.tracking import experiment_id

ROOT = Path(__file__).resolve().parents[1]


def pretraining(client, exp: str, variant: str, curves: dict[str, list[float]], preset: str = "tiny") -> str:
    run_id = client.create_run(exp, run_name=f"{preset}-{variant}", tags={
        "kind": "pretraining", "preset": preset, "variant": variant}).info.run_id
    client.log_batch(run_id, metrics=[Metric(k, v, 0, 10 * (i + 1)) for k, vs in curves.items()
                                      for i, v in enumerate(vs)])
    client.set_terminated(run_id)
    return run_id


def sweep(client, exp: str, pretraining_run: str, scores: dict[str, float], status: str = "FINISHED") -> str:
    run_id = client.create_run(exp, run_name="sweep", tags={"kind": "finetuning-sweep",
                                                            "cocolm.pretraining_run": pretraining_run}).info.run_id
    for task, score in scores.items():
        client.log_metric(run_id, f"best/{task}/median", score)
        client.log_metric(run_id, f"best/{task}/mean", score - 0.5)  # never read as the median
    client.set_terminated(run_id, status)
    return run_id


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = experiment_id(client, "ablation-tiny", uri)
    acc = {"copy_accuracy_replaced": [0.2, 0.5], "copy_accuracy_original": [0.9, 0.95],
           "lm_accuracy_replaced": [0.1, 0.3], "lm_accuracy_original": [0.4, 0.6]}
    runs = {
        "cocolm": pretraining(client, exp, "cocolm", {**acc, "scl_positive_cosine": [0.5, 0.8],
                                                       "scl_negative_cosine": [0.4, 0.2]}),
        "rtd_only": pretraining(client, exp, "rtd_only", {k: v for k, v in acc.items() if k.startswith("copy")}),
        "clm_only": pretraining(client, exp, "clm_only", acc),
    }
    sweep(client, exp, runs["cocolm"], {"SNLI": 0.80, "RTE": 0.60})
    sweep(client, exp, runs["rtd_only"], {"SNLI": 0.75})  # RTE never fine-tuned: missing, not 0
    sweep(client, exp, runs["clm_only"], {"SNLI": 0.10, "RTE": 0.10}, status="FAILED")  # ignored
    sweep(client, exp, runs["clm_only"], {"SNLI": 0.82, "RTE": 0.0})  # a real 0 stays a 0
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
    csv = pd.read_csv(tmp_path / "out" / "finetuning_table.csv").set_index("variant")
    assert np.isnan(csv.loc["rtd_only", "RTE"])  # an empty cell, not 0
    for name in ("fig8_copy_lm_accuracy.png", "fig7_scl_cosine.png"):
        assert (tmp_path / "out" / name).stat().st_size > 10_000
    assert not (tmp_path / "out" / "fig1_cls_cosine.png").exists()  # jobs.represent never ran here
    claims = (tmp_path / "out" / "claims.md").read_text().splitlines()
    rows = [line for line in claims if line.startswith("| ") and "verdict" not in line]
    assert rows and all(line.rstrip().endswith("** |") for line in rows)  # a verdict on every row
    assert any("rtd_only" in line and "**holds**" in line for line in rows)  # 80 vs 75, one seed each


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
    assert list(empty.columns) == ["preset", "variant", "run_name", "run_id", "AVG"] and empty["AVG"].isna().all()
    assert "| tiny | rtd_only | a |" in score_markdown(ablation_table(empty), with_diffs=True)


def test_glue_average_needs_all_eight_targets_and_skips_mnli_mm():
    glue = {"MNLI-m": 0.8, "MNLI-mm": 0.0, "QQP": 0.8, "QNLI": 0.8, "SST-2": 0.8, "CoLA": 0.8, "RTE": 0.8,
            "MRPC": 0.8, "STS-B": 0.8}
    runs = pd.DataFrame({"preset": ["base"] * 2, "variant": ["cocolm", "rtd_only"], "run_name": ["a", "b"],
                         "run_id": ["1", "2"]})
    scores = pd.DataFrame([{"pretraining_run": "1", "task": t, "score": s} for t, s in glue.items()]
                          + [{"pretraining_run": "2", "task": t, "score": s} for t, s in glue.items() if t != "CoLA"])
    table = finetuning_table(runs, scores)
    assert list(table.columns[4:7]) == ["MNLI-m", "MNLI-mm", "QQP"]  # the paper's column order
    assert table.loc[0, "AVG"] == pytest.approx(0.8) and np.isnan(table.loc[1, "AVG"])


def test_the_newest_finished_run_per_variant_is_reported(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = experiment_id(client, "x", uri)
    old = pretraining(client, exp, "cocolm", {})
    new = pretraining(client, exp, "cocolm", {})
    client.create_run(exp, tags={"kind": "pretraining", "preset": "tiny", "variant": "cocolm"})  # still running
    chosen = latest_per_variant(pretraining_runs(client, [exp]))
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


# ----------------------------------------------------------------------------- jobs.represent (needs torch)


@pytest.mark.timeout(300)
def test_represent_logs_cosines_on_the_pretraining_run_and_the_report_plots_them(tokenizer_dir, tmp_path):
    import torch

    from jobs.represent import METRICS, Pairs, draw_pairs, main as represent_main, pair_cosines
    from model.encoder import Encoder, EncoderConfig
    from model.export import export_encoder
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(0)
    encoder = Encoder(EncoderConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=2, ffn_size=64,
                                    embedding_size=32, max_positions=64))
    exported = export_encoder(encoder, tmp_path / "encoder", tokenizer_dir=tokenizer_dir)

    pairs = draw_pairs(8, documents=["one document", "another text", "a third one"])
    assert len(pairs.random) == 8 and all(a != b for a, b in pairs.random) and len(pairs.similar) == 8
    assert draw_pairs(8, documents=["one document", "another text", "a third one"]) == pairs  # same pairs every run
    same = pair_cosines(exported, Pairs([("the same words", "the same words")], [("a cat", "a dog")]))
    assert list(same["kind"]) == ["random", "similar"] and same["cosine"][0] == pytest.approx(1.0, abs=1e-5)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = experiment_id(client, "ablation-tiny", uri)
    run_id = pretraining(client, exp, "cocolm", {})
    client.log_artifacts(run_id, str(exported), "encoder")
    represent_main(["--from", run_id, "--tracking-uri", uri, "--pairs", "20", "--max-length", "32",
                    "--out", str(tmp_path / "rep")])
    logged = client.get_run(run_id).data.metrics
    assert set(METRICS) <= set(logged) and -1 <= logged["represent/random_cosine_mean"] <= 1
    assert logged["represent/cosine_gap"] == pytest.approx(
        logged["represent/similar_cosine_mean"] - logged["represent/random_cosine_mean"])
    assert {a.path for a in client.list_artifacts(run_id, "represent")} == {
        "represent/cosines.csv", "represent/fig1_cls_cosine.png"}
    assert (tmp_path / "rep" / "fig1_cls_cosine.png").is_file()
    report = build(client, "ablation-tiny", tmp_path / "out")
    assert (tmp_path / "out" / "fig1_cls_cosine.png") in report.files
