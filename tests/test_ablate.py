"""jobs.studies.ablate: variants x pretraining seeds and their controls pretrained, read out and swept into one
experiment; an interrupted study run again finishes without redoing what was done."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from helpers import ONE_POINT_GRID, empty_store

from jobs.studies import probe
from jobs.studies.ablate import finished_sweep, main


def test_a_dry_run_prints_the_plan_and_runs_nothing(tmp_path, capsys, monkeypatch):
    import jobs.studies.ablate as ablate

    monkeypatch.setattr(ablate, "_run_units", lambda *args: pytest.fail("a dry run must not run anything"))
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    result = main(["--preset", "tiny", "--variants", "cocolm,electra", "--pretraining-seeds", "2", "--tasks", "snli",
                   "--grid", "quick", "--seeds", "1", "--dry-run"])
    assert capsys.readouterr().out.splitlines()[:2] == [
        "plan: 2 variant(s) x 2 pretraining seed(s) = 4 pretraining runs of 300 steps (preset tiny), and 2 "
        "random-init control(s); each read out",
        "plan: each of the 6 runs swept on snli (3 grid points) x 1 seed = 3 trials (grid quick, learning rates "
        "base); 18 trials in all",
    ]
    assert result.variants == [] and not (tmp_path / "home").exists()


def test_a_finished_sweep_is_found_only_for_the_same_run_tasks_grid_seeds_and_label_fractions(tmp_path):
    from jobs.tracking import experiment_id

    uri = empty_store(tmp_path)
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


def test_each_seed_pretrains_and_reads_out_every_variant_then_its_control(tmp_path, monkeypatch, capsys):
    """The study's order (seeds outer; the control once per seed, after its last variant) and what each
    result carries, with several variants: the end-to-end test below runs one. No Ray: the pretraining
    runs and the controls are fake finished runs as the jobs leave them."""
    from helpers import fake_pretraining_run

    from jobs.pretraining.job import PretrainResult
    from jobs.studies import ablate, control

    uri = empty_store(tmp_path)
    client, done = MlflowClient(uri), []

    def pretrained(cfg, tracking_uri, storage, experiment):
        done.append((cfg.train.seed, cfg.variant))
        exp = client.get_experiment_by_name(experiment).experiment_id
        run_id = fake_pretraining_run(client, exp, cfg.variant, {"loss": [9.0], "copy_accuracy_replaced": [0.5]})
        return PretrainResult(run_id, cfg.variant, "", tracking_uri, "FINISHED")

    def made_control(client_, experiment, cfg, seed):
        done.append((seed, "random_init"))
        exp = client.get_experiment_by_name(experiment).experiment_id
        return fake_pretraining_run(client, exp, "random_init", {}, seed=seed), True

    monkeypatch.setattr(ablate.pretrain, "run", pretrained)
    monkeypatch.setattr(control, "random_init_run", made_control)
    study = main(["--variants", "cocolm,rtd_only", "--pretraining-seeds", "2", "--tracking-uri", uri,
                  "--represent-pairs", "0", "--probe-pairs", "0"])
    order = [(0, "cocolm"), (0, "rtd_only"), (0, "random_init"), (1, "cocolm"), (1, "rtd_only"), (1, "random_init")]
    assert done == order
    assert [(v.seed, v.variant) for v in study.variants] == order
    assert [v.pretraining_status for v in study.variants] == ["FINISHED", "FINISHED", "CONTROL"] * 2
    for v in study.variants:  # each run tagged with its seed and the gate's verdict
        tags = client.get_run(v.pretraining_run).data.tags
        assert tags["pretraining_seed"] == str(v.seed) and tags["cocolm.gate"] == v.gate != ""
    # After each unit, a line with how many are done, what this one took and the time left at this pace.
    done = [line for line in capsys.readouterr().out.splitlines() if " done; " in line]
    assert [line.split(": ", 1)[1].split(" took ")[0] for line in done] == [
        "1/6 done; cocolm, seed 0", "2/6 done; rtd_only, seed 0", "3/6 done; random-init control, seed 0",
        "4/6 done; cocolm, seed 1", "5/6 done; rtd_only, seed 1", "6/6 done; random-init control, seed 1"]
    assert all(" left at this sitting's pace ===" in line for line in done[:-1])
    assert done[-1].endswith("; the study is done ===")


def test_the_time_a_study_has_left_counts_each_unit_at_its_variants_pace():
    from jobs.studies.ablate import minutes_left

    took = {"cocolm": [30.0, 34.0], "electra": [18.0]}
    assert minutes_left({}, [("cocolm", 5.0)], ["electra"], 2) is None  # no unit did work yet
    # Waiting: cocolm 32 (its mean), electra 18, random_init 26 (no unit yet: the mean of all three);
    # going: an electra unit that has run 10 of its 18.
    assert minutes_left(took, [("electra", 10.0)], ["cocolm", "electra", "random_init"], 1) == pytest.approx(
        32 + 18 + (30 + 34 + 18) / 3 + 8)
    assert minutes_left(took, [("electra", 10.0)], ["cocolm", "electra", "random_init"], 2) == pytest.approx(
        (32 + 18 + (30 + 34 + 18) / 3 + 8) / 2)  # two slots share the work
    assert minutes_left(took, [("electra", 25.0)], [], 1) == 0.0  # a unit past its variant's pace: none left, not less


@pytest.mark.slow(seconds=106)
@pytest.mark.timeout(1500)
def test_an_interrupted_study_rerun_finishes_without_redoing_what_was_done(ray_local, tokenizer_dir, small_corpus,
                                                                           tmp_path, monkeypatch, capsys):
    """One variant, two pretraining seeds and the random-init control per seed; the first invocation is
    stopped (as by Ctrl-C) while probing the second seed's run, the second one finishes the study:
    nothing that finished (pretraining, [CLS] cosines, probes, sweeps, controls) is done twice.

    The smallest study that has each kind of work both done before the stop and left to do after it: a
    whole seed (its run and its control, every readout and sweep), a run stopped between its readouts
    (pretraining and [CLS] cosines done, probe and sweep not) and a control never made. A second
    variant would only repeat the first; that a variant training no language-model head exports none
    (rtd_only here before) is tests/test_variants.py::test_only_the_variants_that_train_a_language_model_head_keep_one."""
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    uri = empty_store(tmp_path)
    grid = tmp_path / "one_point.yaml"
    grid.write_text(ONE_POINT_GRID)
    argv = ["--preset", "tiny", "--variants", "cocolm", "--pretraining-seeds", "2", "--tracking-uri", uri,
            "--tasks", "snli", "--grid", str(grid), "--seeds", "1", "--max-train", "48", "--max-dev", "16",
            "--represent-pairs", "20", "--probe-pairs", "60",
            "--set", f"data.tokenizer_dir={tokenizer_dir}", "--set", f"data.paths=[{str(small_corpus)!r}]",
            "--set", "train.max_steps=10", "--set", "train.warmup_steps=2", "--set", "train.log_every=5"]
    real_probe, probed = probe.analyse_run, []

    def interrupted(client, run_id, task, *args, **kwargs):
        if len(probed) == 2:  # seed 0's run and its control are probed; seed 1's run is not
            raise KeyboardInterrupt
        probed.append(run_id)
        return real_probe(client, run_id, task, *args, **kwargs)
    monkeypatch.setattr(probe, "analyse_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    monkeypatch.setattr(probe, "analyse_run", real_probe)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("ablation-tiny").experiment_id
    pretraining = client.search_runs([exp], filter_string="tags.kind = 'pretraining'")
    assert sorted((r.data.tags["variant"], r.data.tags["pretraining_seed"]) for r in pretraining) == [
        ("cocolm", "0"), ("cocolm", "1"), ("random_init", "0")]
    first_runs = {r.info.run_id for r in pretraining}
    assert len(client.search_runs([exp], filter_string="tags.kind = 'finetuning-sweep'")) == 2  # seed 0 and control

    study = main(argv)
    by_key = {(v.variant, v.seed): v for v in study.variants}
    assert sorted(by_key) == [("cocolm", 0), ("cocolm", 1), ("random_init", 0), ("random_init", 1)]
    for key in (("cocolm", 0), ("random_init", 0)):  # seed 0: everything was done before
        assert (by_key[key].sweep_status, by_key[key].represent_status) == ("ALREADY_FINISHED",) * 2
        assert by_key[key].pretraining_status in ("ALREADY_FINISHED", "CONTROL")
    assert by_key[("cocolm", 1)].pretraining_status == "ALREADY_FINISHED"
    assert by_key[("cocolm", 1)].represent_status == "ALREADY_FINISHED"  # read out before the stop: kept
    assert by_key[("cocolm", 1)].sweep_status == "FINISHED"
    assert by_key[("random_init", 1)].sweep_status == "FINISHED"  # the control the stop left unmade
    pretraining = client.search_runs([exp], filter_string="tags.kind = 'pretraining'")
    assert len(pretraining) == 4 and first_runs <= {r.info.run_id for r in pretraining}
    assert len(client.search_runs([exp], filter_string="tags.kind = 'finetuning-sweep'")) == 4  # one per run
    for r in pretraining:  # each readout logged once: one value in every history
        assert len(client.get_metric_history(r.info.run_id, "probe/cls_test_accuracy")) == 1
        assert len(client.get_metric_history(r.info.run_id, "represent/random_cosine_mean")) == 1
        gate = r.data.tags["cocolm.gate"]  # 10 steps train nothing: every variant's run fails the gate, and says why
        assert gate == "control" if r.data.tags["variant"] == "random_init" else gate.startswith("failed: ")
        exported = {a.path for a in client.list_artifacts(r.info.run_id, "encoder")}
        # The CLM head travels with cocolm's encoder for prompt-based fine-tuning; the control has none.
        assert ("encoder/lm_head.safetensors" in exported) == (r.data.tags["variant"] == "cocolm")
    sweeps = client.search_runs([exp], filter_string="tags.kind = 'finetuning-sweep'")
    assert {r.data.tags["cocolm.pretraining_run"] for r in sweeps} == {r.info.run_id for r in pretraining}
    assert all("best/SNLI/median" in r.data.metrics for r in sweeps)
    out = capsys.readouterr().out
    comparable = out[out.rindex("pretraining metrics comparable across variants"):].splitlines()
    cocolm_line = next(line for line in comparable if line.strip().startswith("cocolm "))
    assert "lm_accuracy_replaced" in cocolm_line and cocolm_line.index("copy_accuracy") < cocolm_line.index("| loss")
    assert "compare runs:" in out and "runs table:" in out and "gate: " in out  # links into the MLflow UI

    capsys.readouterr()
    again = main(argv)  # a finished study: nothing runs
    assert {(v.sweep_status, v.represent_status) for v in again.variants} == {("ALREADY_FINISHED",) * 2}
    done = [line for line in capsys.readouterr().out.splitlines() if " done; " in line]
    assert len(done) == 4 and all("was done before" in line and "took" not in line for line in done)
    assert len(client.search_runs([exp], filter_string="tags.kind = 'pretraining'")) == 4


def test_pretraining_seeds_set_both_seeds_and_refuse_a_pinned_one():
    from jobs.cli import UserError
    from jobs.studies.ablate import AblationOptions, seed_configs

    configs = seed_configs(AblationOptions(variants=("cocolm", "electra"), pretraining_seeds=3))
    assert list(configs) == [(s, v) for s in range(3) for v in ("cocolm", "electra")]  # seeds outer
    assert all(cfg.train.seed == s and cfg.data.seed == s for (s, _), cfg in configs.items())
    one = seed_configs(AblationOptions(variants=("cocolm",), overrides=("train.seed=7",)))
    assert list(one) == [(7, "cocolm")]
    with pytest.raises(UserError, match="fixes the seed that --pretraining-seeds 2 varies"):
        seed_configs(AblationOptions(variants=("cocolm",), pretraining_seeds=2, overrides=("data.seed=3",)))
    replication = seed_configs(AblationOptions(variants=("cocolm",), pretraining_seeds=2, first_seed=4))
    assert [(s, cfg.train.seed, cfg.data.seed) for (s, _), cfg in replication.items()] == [(4, 4, 4), (5, 5, 5)]
    assert [s for s, _ in seed_configs(AblationOptions(variants=("cocolm",), first_seed=6))] == [6]
    with pytest.raises(UserError, match="fixes the seed that --first-seed 6 varies"):
        seed_configs(AblationOptions(variants=("cocolm",), first_seed=6, overrides=("train.seed=1",)))


def test_concurrent_runs_refuse_a_ray_too_small_for_their_streams(ray_local, tmp_path, capsys):
    """Two runs at once on the suite's 2-CPU Ray would hang at their first batch (Ray Data's coordinator
    shares leftover CPUs in whole CPUs): an error instead, before any run starts."""
    from jobs.cli import UserError

    with pytest.raises(UserError, match="--concurrent-runs 2 needs a Ray with at least 4 logical CPUs, this one has 2"):
        main(["--preset", "tiny", "--variants", "cocolm,roberta_mlm", "--concurrent-runs", "2", "--no-control",
              "--tracking-uri", empty_store(tmp_path)])
    assert "MLflow run" not in capsys.readouterr().out


@pytest.mark.slow(seconds=54)
@pytest.mark.timeout(900)
def test_two_runs_go_at_once_on_the_studys_own_ray(tokenizer_dir, small_corpus, tmp_path):
    """--concurrent-runs 2 in a process of its own (its own Ray, started with 4 logical CPUs): both runs
    pretrain at the same time, finish, are read out and gated, and the summary lists them in order."""
    import os
    import subprocess
    import sys

    uri = empty_store(tmp_path)
    env = {**os.environ, "COCOLM_HOME": str(tmp_path / "home")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "jobs.studies.ablate", "--preset", "tiny", "--variants", "cocolm,roberta_mlm",
         "--concurrent-runs", "2", "--no-control", "--represent-pairs", "20", "--probe-pairs", "0",
         "--tracking-uri", uri, "--set", f"data.tokenizer_dir={tokenizer_dir}",
         "--set", f"data.paths=[{str(small_corpus)!r}]", "--set", "train.max_steps=10",
         "--set", "train.warmup_steps=2", "--set", "train.log_every=5"],
        env=env, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.split("ablation study 'ablation-tiny' (2 pretraining runs):")[1]
    assert summary.index("cocolm") < summary.index("roberta_mlm") and summary.count("gate:") == 2
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ablation-tiny").experiment_id])
    assert sorted(r.data.tags["variant"] for r in runs) == ["cocolm", "roberta_mlm"]
    assert all(r.info.status == "FINISHED" and r.data.tags["cocolm.gate"] for r in runs)
    # Each run started before the other ended: run one after the other, the second would start after the
    # first's end. (Not their logged steps against each other: a few tiny steps log within a second or
    # two, and on a loaded 2-core machine one run's stream started late enough that its first step
    # came 1.5 s after the other run's end, both runs live all along.)
    (start_a, end_a), (start_b, end_b) = ((r.info.start_time, r.info.end_time) for r in runs)
    assert start_a < end_b and start_b < end_a, (start_a, end_a, start_b, end_b)


def test_a_study_says_where_its_readouts_read_positions_its_pretraining_never_trained():
    from jobs.studies.ablate import AblationOptions, seed_configs, untrained_positions_note

    def note(*overrides: str, **kw) -> str:
        opts = AblationOptions(variants=("cocolm", "electra"), preset="study-cpu", overrides=overrides, **kw)
        return untrained_positions_note(opts, seed_configs(opts))

    no_long_phase = ("data.long_seq_len=0", "train.long_steps=0")
    assert note("data.seq_len=64", *no_long_phase) == ""  # blocks of 64, every readout at 64 tokens
    assert note("data.seq_len=128", *no_long_phase) == ""
    short = note(*no_long_phase, tasks="snli", grid="study-cpu")  # the preset's blocks of 32 alone
    assert short == ("note: pretraining trains positions 0-31 (data.seq_len, data.long_seq_len), but [CLS] cosines "
                     "read up to 64 tokens, linear probes read up to 64 tokens, fine-tuning (grid study-cpu) read up to 64 tokens: "
                     "the absolute position embeddings from 32 on are never trained (weight decay only shrinks them)")
    assert note(*no_long_phase, probe_pairs=0, represent_pairs=0) == ""  # no readout past 32
    assert note("data.long_seq_len=64", "train.long_steps=200", tasks="snli", grid="study-cpu") == ""
    assert note(tasks="snli", grid="study-cpu") == ""  # the preset's own long phase trains positions 32-63
    assert "fine-tuning (grid paper) read up to 512" in note("data.seq_len=64", *no_long_phase, tasks="glue", grid="paper",
                                                              probe_pairs=0, represent_pairs=0)
