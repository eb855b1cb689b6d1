"""jobs.studies.ablate: two variants pretrained and swept into one experiment; a second invocation skips them."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from jobs.studies.ablate import finished_sweep, main


def test_a_finished_sweep_is_found_only_for_the_same_run_tasks_grid_seeds_and_label_fractions(tmp_path):
    from jobs.tracking import experiment_id

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = experiment_id(client, "ablation-tiny", uri)
    sweep = client.create_run(exp, tags={"kind": "finetuning-sweep", "cocolm.pretraining_run": "p1"}).info.run_id
    for key, value in {"tasks": "snli", "grid": "quick", "seeds": "0,1,2,3,4", "label_fractions": "1"}.items():
        client.log_param(sweep, key, value)
    assert finished_sweep(client, "ablation-tiny", "p1", "snli", "quick", (0, 1, 2, 3, 4)) == ""  # still running
    client.set_terminated(sweep)
    assert finished_sweep(client, "ablation-tiny", "p1", "snli", "quick", (0, 1, 2, 3, 4)) == sweep
    assert finished_sweep(client, "ablation-tiny", "p2", "snli", "quick", (0, 1, 2, 3, 4)) == ""
    assert finished_sweep(client, "ablation-tiny", "p1", "rte", "quick", (0, 1, 2, 3, 4)) == ""
    assert finished_sweep(client, "ablation-tiny", "p1", "snli", "paper", (0, 1, 2, 3, 4)) == ""
    assert finished_sweep(client, "ablation-tiny", "p1", "snli", "quick", (0,)) == ""
    assert finished_sweep(client, "ablation-tiny", "p1", "snli", "quick", (0, 1, 2, 3, 4), (0.1, 1.0)) == ""
    assert finished_sweep(client, "no-such-experiment", "p1", "snli", "quick", (0, 1, 2, 3, 4)) == ""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_variants_are_tracked_with_tags_and_a_rerun_skips_them(ray_local, tokenizer_dir, tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    grid = tmp_path / "one_point.yaml"
    grid.write_text("max_length: 32\nspaces:\n  t: {epochs: [1], lr: [1.0e-3], batch_size: [16], warmup: [0.1]}\n"
                    "tasks: {default: t}\n")
    argv = ["--preset", "tiny", "--variants", "cocolm,rtd_only", "--tracking-uri", uri, "--tasks", "snli",
            "--grid", str(grid), "--seeds", "1", "--max-train", "48", "--max-dev", "16", "--represent-pairs", "20",
            "--set", f"data.tokenizer_dir={tokenizer_dir}", "--set", "train.max_steps=10",
            "--set", "train.warmup_steps=2", "--set", "train.log_every=5"]
    first = main(argv)
    assert [(v.variant, v.pretraining_status, v.sweep_status, v.represent_status) for v in first.variants] == [
        ("cocolm", "FINISHED", "FINISHED", "FINISHED"), ("rtd_only", "FINISHED", "FINISHED", "FINISHED")]

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("ablation-tiny").experiment_id
    pretraining = client.search_runs([exp], filter_string="tags.kind = 'pretraining'")
    assert sorted(r.data.tags["variant"] for r in pretraining) == ["cocolm", "rtd_only"]
    assert all(r.info.status == "FINISHED" and r.data.tags["preset"] == "tiny" for r in pretraining)
    for r in pretraining:  # jobs.studies.represent ran on each (paper Fig. 1), so the report can draw it
        assert {"represent/random_cosine_mean", "represent/cosine_gap"} <= set(r.data.metrics)
        assert "represent/fig1_cls_cosine.png" in {a.path for a in client.list_artifacts(r.info.run_id, "represent")}
        exported = {a.path for a in client.list_artifacts(r.info.run_id, "encoder")}
        # The CLM head travels with cocolm's encoder for prompt-based fine-tuning; rtd_only trains none.
        assert ("encoder/lm_head.safetensors" in exported) == (r.data.tags["variant"] == "cocolm")
    sweeps = client.search_runs([exp], filter_string="tags.kind = 'finetuning-sweep'")
    by_variant = {r.data.tags["variant"]: r for r in sweeps}
    assert set(by_variant) == {"cocolm", "rtd_only"}
    for v in first.variants:
        assert by_variant[v.variant].data.tags["cocolm.pretraining_run"] == v.pretraining_run
    assert "best/SNLI/median" in by_variant["cocolm"].data.metrics
    out = capsys.readouterr().out
    comparable = out[out.index("pretraining metrics comparable across variants"):].splitlines()
    cocolm_line = next(line for line in comparable if line.strip().startswith("cocolm "))
    assert "lm_accuracy_replaced" in cocolm_line and cocolm_line.index("copy_accuracy") < cocolm_line.index("| loss")
    assert "compare runs:" in out and "runs table:" in out  # direct links into the MLflow UI

    second = main(argv)
    assert [(v.pretraining_status, v.sweep_status, v.represent_status) for v in second.variants] == [
        ("ALREADY_FINISHED",) * 3] * 2
    assert [v.pretraining_run for v in second.variants] == [v.pretraining_run for v in first.variants]
    assert [v.sweep_run for v in second.variants] == [v.sweep_run for v in first.variants]
    assert len(client.search_runs([exp], filter_string="tags.kind = 'pretraining'")) == 2
    assert len(client.search_runs([exp], filter_string="tags.kind = 'finetuning-sweep'")) == 2
