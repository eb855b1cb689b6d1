"""Few-shot fine-tuning (paper Table 4): templates and demonstrations, label-word scoring by the language-model
head against a hand computation, the k-shot split sampler, the exported LM head, "not applicable" for
variants without one, and the command on Ray Tune with MLflow."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from model import Encoder
from model.classifier import load_encoder, load_lm_head
from model.export import export_encoder
from model.heads import CLMHead
from jobs.data.schemes import load_scheme
from jobs.pretraining.encoders import resolve_encoder
from jobs.finetuning.prompts import (BUILT_IN, Prompt, PromptClassifier, PromptData, encode_prompts, few_shot_split,
                                     prompt_for, prompt_input, render, sample_demos)
from jobs.finetuning.tasks.snli import read_snli
from jobs.finetuning.tasks.task import Split
from jobs.finetuning.tasks.user import read_user_task
from jobs.names import KIND_FEWSHOT
from helpers import tiny_encoder_config

CLS, SEP, MASK, PAD = 1, 2, 4, 0


def tiny_data() -> PromptData:
    """Two examples by hand: template `{text} ? [MASK] , {text_pair}` with '?' = 50 and ',' = 51."""
    return PromptData(fields=[([10, 11, 12], [20, 21]), ([13], [22, 23, 24, 25])], labels=np.array([0, 1]),
                      pieces=["text", [50], "[MASK]", [51], "text_pair"], label_ids=[60, 61],
                      special={"[CLS]": CLS, "[SEP]": SEP, "[MASK]": MASK, "[PAD]": PAD})


def test_rendering_fills_the_template_and_cuts_the_longest_field_first():
    data = tiny_data()
    assert render(data, 0, MASK, 100) == [10, 11, 12, 50, MASK, 51, 20, 21]
    assert render(data, 1, 61, 100) == [13, 50, 61, 51, 22, 23, 24, 25]  # a demonstration: the label word
    assert render(data, 1, MASK, 6) == [13, 50, MASK, 51, 22, 23]  # 3 fixed tokens + 1 + 4 > 6: the pair loses 2
    ids, position = prompt_input(data, 0, [1], data, max_length=31)  # 2 segments of (31 - 1) // 2 - 1 = 14
    assert ids == [CLS, 10, 11, 12, 50, MASK, 51, 20, 21, SEP, 13, 50, 61, 51, 22, 23, 24, 25, SEP]
    assert ids[position] == MASK and position == 5


def test_only_templates_that_ask_about_the_first_sentence_drop_its_punctuation():
    assert Prompt(*BUILT_IN["snli"]).asks and Prompt(*BUILT_IN["rte"]).asks  # LM-BFF's "sent-"
    assert not Prompt(*BUILT_IN["sst-2"]).asks and not Prompt(*BUILT_IN["mrpc"]).asks  # "sent_0": kept


def test_demonstrations_are_one_per_class_and_never_the_example_itself():
    data = PromptData([([1],)] * 6, np.array([0, 0, 1, 1, 2, 2]), ["text", "[MASK]"], [7, 8, 9], {})
    for seed in range(20):
        demos = sample_demos(data, random.Random(seed), exclude=0)
        assert [int(data.labels[d]) for d in demos] == [0, 1, 2] and demos[0] == 1


def test_the_built_in_prompts_are_lm_bffs_and_the_snli_one_renders_real_text(tokenizer_dir):
    assert BUILT_IN["snli"] == ("{text} ? [MASK] , {text_pair}", {"entailment": "Yes", "neutral": "Maybe",
                                                                  "contradiction": "No"})
    task = read_snli()
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    split = Split(["A man plays a guitar."], ["A person makes music."], [1], "x")
    data, notes = encode_prompts(load_scheme(tokenizer_dir), prompt_for(task), task, split)
    ids = render(data, 0, data.special["[MASK]"], 100)
    assert tokenizer.decode(ids, skip_special_tokens=False).replace(" ", "").replace("▁", "") == \
        "amanplaysaguitar?[MASK],apersonmakesmusic."  # "sent-": the premise's final period is dropped
    assert len(data.label_ids) == 3 and len(set(data.label_ids)) == 3
    assert all("scored by its first" in n for n in notes)  # a 1000-piece vocabulary splits some label words
    with pytest.raises(ValueError, match="exactly one"):
        Prompt("{text} [MASK] [MASK]", {})


def test_a_user_task_declares_its_prompt_next_to_it(tmp_path):
    from helpers import sentiment_file

    path = sentiment_file(tmp_path / "sentiment.jsonl")
    task = read_user_task(path)
    with pytest.raises(ValueError, match="no prompt: write a prompt.json"):
        prompt_for(task, path)
    (tmp_path / "sentiment.prompt.json").write_text(json.dumps(
        {"template": "{text} . it was [MASK] .", "label_words": {"neg": "bad", "pos": "good"}}))
    assert prompt_for(task, path).label_words == {"neg": "bad", "pos": "good"}
    (tmp_path / "sentiment.prompt.json").write_text(json.dumps({"template": "{text} [MASK]", "label_words": {"a": "b"}}))
    with pytest.raises(ValueError, match="label words for"):
        prompt_for(task, path)


def test_the_k_shot_splits_are_balanced_seeded_and_disjoint():
    task = read_snli()
    train, dev = few_shot_split(task, 16, 13)
    labels = task.train.labels
    for rows in (train, dev):
        assert sorted(np.bincount([labels[i] for i in rows]).tolist()) == [16, 16, 16]
    assert not set(train) & set(dev)
    assert few_shot_split(task, 16, 13) == (train, dev) and few_shot_split(task, 16, 21)[0] != train
    with pytest.raises(ValueError, match="need 200000 of each label"):
        few_shot_split(task, 100_000, 13)


def test_label_words_are_scored_by_the_lm_head_at_the_mask_as_by_hand(tokenizer_dir):
    torch.manual_seed(0)
    encoder = Encoder(tiny_encoder_config(tokenizer_dir)).eval()
    head = CLMHead(encoder.embeddings.tokens)
    torch.nn.init.normal_(head.bias)
    model = PromptClassifier(encoder, head, [60, 61, 62])
    ids = torch.tensor([[CLS, 10, MASK, 11, SEP, PAD], [CLS, MASK, 12, 13, 14, SEP]])
    mask, positions = ids != PAD, torch.tensor([2, 1])
    logits = model(ids, mask, positions)
    h = encoder(ids, mask)
    for b in range(2):  # h_[MASK] . E_w + b_w for each label word w
        by_hand = torch.stack([h[b, positions[b]] @ encoder.embeddings.tokens.weight[w] + head.bias[w]
                               for w in (60, 61, 62)])
        assert torch.allclose(logits[b], by_hand, atol=1e-5)
    loss = F.cross_entropy(logits, torch.tensor([0, 2]))
    loss.backward()
    assert encoder.embeddings.tokens.weight.grad[60].abs().sum() > 0 and head.bias.grad[61] != 0


def test_the_lm_head_is_exported_with_the_encoder_and_its_absence_is_known(tmp_path, tokenizer_dir):
    torch.manual_seed(0)
    encoder = Encoder(tiny_encoder_config(tokenizer_dir))
    head = CLMHead(encoder.embeddings.tokens)
    torch.nn.init.normal_(head.bias)
    with_head = export_encoder(encoder, tmp_path / "with", tokenizer_dir, lm_head=head)
    loaded = load_encoder(with_head)
    again = load_lm_head(with_head, loaded)
    assert torch.equal(again.bias, head.bias) and again.embeddings is loaded.embeddings.tokens  # tied again
    assert resolve_encoder(str(with_head), None, tmp_path).lm_head_kind == "clm"
    without = resolve_encoder(str(export_encoder(encoder, tmp_path / "without", tokenizer_dir)), None, tmp_path)
    assert without.lm_head_state is None
    with pytest.raises(ValueError, match="no language-model head"):
        without.build_with_lm_head()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_command_runs_both_methods_on_ray_tune_and_reports_mean_and_std(ray_local, tmp_path, tokenizer_dir,
                                                                             monkeypatch, capfd):
    from helpers import pretraining_run_with_encoder, sentiment_file
    from jobs.finetuning.fewshot import FewShotOptions, run

    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    encoder = Encoder(tiny_encoder_config(tokenizer_dir))
    with_head = export_encoder(encoder, tmp_path / "cocolm", tokenizer_dir, lm_head=CLMHead(encoder.embeddings.tokens))
    task = sentiment_file(tmp_path / "sentiment.jsonl")
    (tmp_path / "sentiment.prompt.json").write_text(json.dumps(
        {"template": "{text} . it was [MASK] .", "label_words": {"neg": "bad", "pos": "good"}}))
    tracking_uri, client, run_id = pretraining_run_with_encoder(tmp_path, with_head)
    common = dict(tasks=str(task), shots=4, splits=2, lrs=(1e-3,), steps=4, eval_every=2, batch_size=4, max_length=64,
                  tracking_uri=tracking_uri, storage=str(tmp_path / "ray"))
    result = run(FewShotOptions(source=run_id, **common))
    table = result.table.set_index("method")
    assert list(table.index) == ["prompt", "head"] and (table["status"] == "ok").all()
    assert len(result.trials) == 4 and result.trials["test"].between(0, 1).all()
    prompt = result.trials[result.trials["method"] == "prompt"]["test"]
    assert table.loc["prompt", "score_mean"] == pytest.approx(prompt.mean())
    assert table.loc["prompt", "score_std"] == pytest.approx(prompt.std())
    out, err = capfd.readouterr()
    assert "| sentiment | prompt |" in out and "mean (std) over the splits" in out
    assert "Could not fetch metrics" not in out + err  # Tune's result files are written (its CSV/JSON loggers)
    parent = client.get_run(result.run_id)
    assert parent.data.tags["kind"] == KIND_FEWSHOT and "fewshot/sentiment/prompt/mean" in parent.data.metrics
    per_split = {k: v for k, v in parent.data.metrics.items() if k.startswith("fewshot/sentiment/prompt/seed_")}
    assert sorted(per_split.values()) == sorted(prompt)  # each split's test accuracy, for the claims' tests
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{result.run_id}'")
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert {"dev.accuracy", "best.dev.accuracy", "test.accuracy"} <= set(children[0].data.metrics)

    # An encoder without a language-model head (rtd_only, electra): prompts are not applicable, heads still run.
    no_head = export_encoder(encoder, tmp_path / "rtd_only", tokenizer_dir)
    result = run(FewShotOptions(source=str(no_head), **common))
    rows = result.table.set_index("method")
    assert rows.loc["prompt", "status"].startswith("not applicable") and rows.loc["head", "status"] == "ok"
    assert set(result.trials["method"]) == {"head"}
