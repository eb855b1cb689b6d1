"""jobs.studies.represent: [CLS] cosines logged on the pretraining run, plotted by the report."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from analysis.report import build
from jobs.names import REPRESENT_METRICS
from jobs.studies.represent import Pairs, draw_pairs, main as represent_main, pair_cosines
from jobs.tracking import experiment_id
from helpers import empty_store, fake_pretraining_run


@pytest.mark.timeout(300)
def test_represent_logs_cosines_on_the_pretraining_run_and_the_report_plots_them(exported, tmp_path, capsys):

    pairs = draw_pairs(8, documents=["one document", "another text", "a third one"])
    assert len(pairs.random) == 8 and all(a != b for a, b in pairs.random) and len(pairs.similar) == 8
    assert draw_pairs(8, documents=["one document", "another text", "a third one"]) == pairs  # same pairs every run
    same = pair_cosines(exported, Pairs([("the same words", "the same words")], [("a cat", "a dog")]))
    assert list(same["kind"]) == ["random", "similar"] and same["cosine"][0] == pytest.approx(1.0, abs=1e-5)

    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    exp = experiment_id(client, "ablation-tiny", uri)
    run_id = fake_pretraining_run(client, exp, "cocolm", {})
    client.log_artifacts(run_id, str(exported), "encoder")
    represent_main(["--from", run_id, "--tracking-uri", uri, "--pairs", "20", "--max-length", "32",
                    "--out", str(tmp_path / "rep")])
    logged = client.get_run(run_id).data.metrics
    assert set(REPRESENT_METRICS) <= set(logged) and -1 <= logged["represent/random_cosine_mean"] <= 1
    assert logged["represent/cosine_gap"] == pytest.approx(
        logged["represent/similar_cosine_mean"] - logged["represent/random_cosine_mean"])
    assert {a.path for a in client.list_artifacts(run_id, "represent")} == {
        "represent/cosines.csv", "represent/fig1_cls_cosine.png"}
    assert (tmp_path / "rep" / "fig1_cls_cosine.png").is_file()
    printed = capsys.readouterr().out  # where the results went: the run, its metrics and artifacts, a link
    assert f"run {run_id}: mean cosine random" in printed and "represent/cosines.csv" in printed
    assert f"this run:      http://127.0.0.1:5000/#/experiments/{exp}/runs/{run_id}" in printed
    report = build(client, "ablation-tiny", tmp_path / "out")
    assert (tmp_path / "out" / "fig1_cls_cosine.png") in report.files
