"""SQuAD 2.0: the reader on fixture files in the official format, windows and answer positions, the
answer search from logits (against hand computations), the start/end head and its loss, one trial
scored as the official metric scores it, and sweeps end to end on Ray Tune with MLflow (of a platform
encoder, and of the authors' checkpoint with their tokenizer: tests/test_official_paths.py has its windows)."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient

from model import Encoder
from model.classifier import SpanExtractor
from jobs.cli import UserError
from jobs.pretraining.encoders import resolve_encoder
from jobs.finetuning.encoding import encode_task
from jobs.finetuning.grid import load_grid
from jobs.finetuning.sweep import SweepOptions, run
from jobs.finetuning.tasks import load_tasks
from jobs.finetuning.tasks.glue import read_glue_task
from jobs.finetuning.tasks.specs import SQUAD_V2
from jobs.finetuning.tasks.squad import SQUAD_URL, read_squad_file, read_squad_v2
from jobs.finetuning.tasks.squad_eval import evaluate as official
from jobs.finetuning.tasks.squad_windows import SpanIndex, answer_tokens, best_answers, windows
from jobs.finetuning import trial
from jobs.finetuning.trial import TrialConfig, fine_tune, predict_answers, score, task_loss
from jobs.data.tokens import load_tokenizer
from jobs.names import best_task_metric
from helpers import empty_store, sweep_inputs, tiny_encoder_config

FIXTURE = Path(__file__).parent / "fixtures" / "squad_v2"
WINDOWS = {"max_length": 64, "doc_stride": 16, "max_question_length": 16}  # several windows per paragraph


# ----------------------------------------------------------------------------- reading


def test_the_official_format_is_read_with_every_kind_of_question():
    task = read_squad_v2(FIXTURE)
    train, dev = task.train, task.dev["dev"]
    assert (len(train), len(dev), task.skipped) == (24, 10, ())
    assert len({q.context for q in train.items}) == 4 and len({q.context for q in dev.items}) == 3  # paragraphs
    unanswerable = [q.id for q in train.items if not q.answerable]
    assert len(unanswerable) == 8 and "t-rhine-6" in unanswerable
    plausible = next(q for q in train.items if q.id == "t-rhine-5")  # plausible_answers are not answers
    assert plausible.answers == ()
    several = next(q for q in dev.items if q.id == "d-cafe-2")
    assert [t for t, _ in several.answers] == ["1876", "in 1876", "opened in 1876"]
    accented = next(q for q in train.items if q.id == "t-rhine-1")  # non-ASCII: character offsets, not bytes
    start, end = accented.span()
    assert accented.context[start:end] == "the Swiss canton of Graubünden"


def squad_file(path: Path, questions: list) -> Path:
    context = "Alice lives in Paris and works in Berlin."
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": questions}]}]}), encoding="utf-8")
    return path


def good(i: int) -> dict:
    return {"id": f"q{i}", "question": "Where does Alice live?", "is_impossible": False,
            "answers": [{"text": "Paris", "answer_start": 15}]}


def test_malformed_entries_are_skipped_and_reported_and_a_mostly_malformed_file_is_an_error(tmp_path):
    bad = {"id": "bad", "question": "Where?", "is_impossible": False, "answers": [{"text": "Paris", "answer_start": 3}]}
    questions, skipped = read_squad_file(squad_file(tmp_path / "one-bad.json", [good(i) for i in range(150)] + [bad]))
    assert len(questions) == 150
    assert [(s.line, s.reason) for s in skipped] == [
        ("data[0].paragraphs[0].qas[150]", "no answer text is in the context at its `answer_start`")]
    contradiction = {**good(0), "is_impossible": True}
    with pytest.raises(ValueError, match=r"(?s)2 of 3 rows are malformed.*contradicts.*qas\[1\]"):
        read_squad_file(squad_file(tmp_path / "bad.json", [good(0), contradiction, {"id": "x"}]))
    (tmp_path / "broken.json").write_text('{"data": [')
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        read_squad_file(tmp_path / "broken.json")


def test_missing_files_say_where_to_get_them(tmp_path):
    with pytest.raises(ValueError, match="needs --data-dir.*never downloads"):
        load_tasks("squad_v2")
    with pytest.raises(UserError, match=f"train-v2.0.json.*{SQUAD_URL}"):
        read_squad_v2(tmp_path)


def test_squad_and_glue_are_read_from_one_data_dir(tmp_path):
    from test_readers import write_glue

    write_glue(tmp_path)
    for name in ("train-v2.0.json", "dev-v2.0.json"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    tasks = load_tasks("rte,squad_v2,RTE", tmp_path)
    assert [t.spec.name for t in tasks] == ["rte", "squad_v2"]
    assert tasks[0].dev["dev"].labels == read_glue_task("rte", tmp_path).dev["dev"].labels
    with pytest.raises(ValueError, match="'squad' is neither"):
        load_tasks("squad", tmp_path)


def test_the_paper_grid_has_the_squad_space_of_table_8():
    grid = load_grid("paper")
    points = grid.points("squad_v2")
    assert len(points) == 2 * 4 * 2 * 2  # epochs {2, 3} x 4 learning rates x batch {16, 32} x warm-up {6%, 10%}
    assert {p["epochs"] for p in points} == {2, 3} and {p["lr"] for p in points} == {2e-5, 3e-5, 4e-5, 5e-5}
    space = grid.space("squad_v2")
    assert (grid.max_length_of("squad_v2"), space.doc_stride, space.max_question_length) == (384, 128, 64)
    assert grid.max_length_of("rte") == 512 and load_grid("quick").max_length_of("squad_v2") == 128


# ----------------------------------------------------------------------------- windows and answer positions


def test_windows_start_doc_stride_tokens_apart_and_cover_the_context():
    assert windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]  # the last one ends at token 10
    assert windows(3, 4, 2) == [(0, 3)]
    assert windows(9, 4, 8) == [(0, 4), (4, 4), (8, 1)]  # a stride beyond the window: no token skipped


def test_answer_tokens_are_the_tokens_that_overlap_its_characters():
    offsets = np.array([[0, 3], [3, 9], [9, 15], [15, 16]])  # "The", " Rhine", " flows", "."
    assert answer_tokens(offsets, 4, 9) == (1, 1)  # "Rhine": the token's leading space is outside it
    assert answer_tokens(offsets, 4, 15) == (1, 2)
    assert answer_tokens(offsets, 16, 18) == (-1, -1)


def test_each_window_holds_the_whole_answer_or_points_at_cls(exported):
    task = read_squad_v2(FIXTURE)
    encoded = encode_task(task, exported, **WINDOWS)
    split, spans = encoded.train, encoded.train.spans
    tokenizer = load_tokenizer(exported)
    assert len(split) == len(spans.question) > len(task.train)  # long paragraphs make several windows
    cut_answers = 0
    for w, q in enumerate(spans.question.tolist()):
        question = task.train.items[q]
        ids = split.ids[split.offsets[w] : split.offsets[w + 1]]
        assert len(ids) <= 64 and ids[0] == tokenizer.token_to_id("[CLS]") and ids[-1] == tokenizer.token_to_id("[SEP]")
        start, end = split.labels[w]
        first, token_start, length = int(spans.first[w]), int(spans.token_start[w]), int(spans.length[w])
        if start:  # the answer's characters, read back through the offsets of the window's tokens
            chars = spans.char_offsets[q][token_start + start - first : token_start + end - first + 1]
            assert question.context[chars[0, 0] : chars[-1, 1]].strip() == question.answers[0][0]
        elif question.answerable:
            a, b = answer_tokens(spans.char_offsets[q], *question.span())
            inside = token_start <= a and b < token_start + length
            assert not inside
            cut_answers += token_start <= b and a < token_start + length  # partly inside: cut by the window
        else:
            assert (start, end) == (0, 0)
    answerable = {q for q, item in enumerate(task.train.items) if item.answerable}
    assert answerable == {int(q) for q, (s, _) in zip(spans.question, split.labels) if s}  # each found somewhere
    assert cut_answers >= 1  # the fixture's long answer crosses a window boundary


# ----------------------------------------------------------------------------- logits -> answers


def test_the_answer_search_matches_a_hand_computation():
    context = "ab cd ef gh"
    offsets = np.array([[0, 2], [2, 5], [5, 8], [8, 11]])  # "ab", " cd", " ef", " gh"
    # Question 0 in two windows: window 0 holds context tokens 0-2 at positions 3-5, window 1 tokens 1-3 at 3-5.
    # Question 1 in one window (tokens 0-3 at positions 2-5).
    spans = SpanIndex(np.array([0, 0, 1]), np.array([3, 3, 2]), np.array([0, 1, 0]), np.array([3, 3, 4]),
                      [offsets, offsets], [context, context], ["q0", "q1"], {"q0": ["cd ef"], "q1": [""]})
    neg = -9.0
    start = [np.array([1.0, neg, neg, 0.5, 2.0, 0.0]),  # window 0: best start " cd" (2.0)
             np.array([0.0, neg, neg, 1.0, 3.0, 0.0]),  # window 1: best start " ef" (3.0)
             np.array([4.0, neg, 1.0, 0.0, 0.0, 0.0])]
    end = [np.array([1.0, neg, neg, 0.0, 0.0, 2.5]),  # window 0: " cd".." ef" = 2.0 + 2.5 = 4.5
           np.array([0.5, neg, neg, 0.0, 0.0, 1.0]),  # window 1: " ef".." gh" = 3.0 + 1.0 = 4.0
           np.array([3.0, neg, 1.0, 0.0, 0.0, 0.0])]
    predictions, na_probs = best_answers(spans, start, end)
    # q0: best span 4.5 ("cd ef", window 0) beats 4.0; no-answer = min(1 + 1, 0 + 0.5) = 0.5
    assert predictions["q0"] == "cd ef" and na_probs["q0"] == pytest.approx(1 / (1 + math.exp(-(0.5 - 4.5))))
    # q1: best span "ab" 1 + 1 = 2; no-answer 4 + 3 = 7 beats it
    assert predictions["q1"] == "" and na_probs["q1"] == pytest.approx(1 / (1 + math.exp(-(7 - 2))))
    # At most one token per answer: window 0's one-token spans score 0.5, 2.0, 2.5 and window 1's 1.0, 3.0, 1.0,
    # so " ef" in window 1 (3.0 + 0.0) wins.
    predictions, _ = best_answers(spans, start, end, max_answer_length=1)
    assert predictions["q0"] == "ef"
    # n-best 1: each window pairs only its best start with its best end: (" cd", " ef") = 4.5 in window 0,
    # (" ef", " gh") = 4.0 in window 1; the answer stays "cd ef".
    assert best_answers(spans, start, end, n_best=1)[0]["q0"] == "cd ef"


def test_an_end_before_its_start_is_never_an_answer():
    offsets = np.array([[0, 1], [1, 3]])
    spans = SpanIndex(np.array([0]), np.array([1]), np.array([0]), np.array([2]), [offsets], ["a b"], ["q"],
                      {"q": ["a"]})
    predictions, na_probs = best_answers(spans, [np.array([-5.0, -1.0, 5.0])], [np.array([-5.0, 5.0, -1.0])], n_best=1)
    assert predictions["q"] == "" and na_probs["q"] == 1.0  # the only pair (start "b", end "a") is invalid


# ----------------------------------------------------------------------------- the head and the loss


def test_the_span_loss_is_the_mean_start_and_end_cross_entropy_and_padding_never_wins(tokenizer_dir):
    torch.manual_seed(0)
    model = SpanExtractor(Encoder(tiny_encoder_config(tokenizer_dir)))
    ids = torch.randint(5, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    logits = model(ids, mask)
    assert logits.shape == (2, 7, 2) and (logits[1, 5:] == torch.finfo(logits.dtype).min).all()
    labels = torch.tensor([[2, 4], [0, 0]])
    loss = task_loss(SQUAD_V2, logits, labels)
    by_hand = 0.0
    for b in range(2):
        for k in range(2):
            row = logits[b, : 7 if b == 0 else 5, k].detach()
            by_hand += -(row[labels[b, k]] - torch.logsumexp(row, 0)) / 4  # mean over 2 rows, then of start and end
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert F.softmax(logits[1, :, 0], -1)[5:].sum() == 0  # padding gets no probability
    loss.backward()
    assert model.span.weight.grad.abs().sum() > 0 and model.encoder.embeddings.tokens.weight.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- one trial, scored officially


def test_a_trial_is_scored_as_the_official_evaluation_scores_its_predictions(tmp_path, exported, monkeypatch):
    encoded = encode_task(read_squad_v2(FIXTURE), exported, **WINDOWS)
    encoder = resolve_encoder(str(exported), None, tmp_path)
    cfg = TrialConfig(task="squad_v2", lr=1e-3, batch_size=16, epochs=1, warmup=0.1, seed=0, evals_per_epoch=1)
    captured = {}

    def keep_model(model, split, task, device, autocast):  # the one evaluation's model, to predict with again
        captured["model"] = copy.deepcopy(model)
        return score(model, split, task, device, autocast)

    monkeypatch.setattr(trial, "score", keep_model)
    result = fine_tune(cfg, encoded, encoder)
    best = result.best["dev"]
    assert set(best) >= {"f1", "exact", "has_ans_f1", "no_ans_f1", "best_f1", "best_exact", "score"}
    assert best["score"] == best["f1"] and 0 <= best["exact"] <= best["f1"] <= 1
    assert result.flat()["best.dev.f1"] == best["f1"]
    # The same model's predictions, written out and scored from the official file by the metric:
    predictions, na_probs = predict_answers(captured["model"], encoded.dev["dev"], encoded.pad_id,
                                            torch.device("cpu"), torch.autocast("cpu", enabled=False))
    gold = {q["id"]: [a["text"] for a in q["answers"]] or [""] for article in
            json.loads((FIXTURE / "dev-v2.0.json").read_text())["data"] for p in article["paragraphs"] for q in p["qas"]}
    scored = official(gold, predictions, na_probs)
    assert scored["total"] == 10 and best["f1"] == pytest.approx(scored["f1"] / 100)
    assert best["exact"] == pytest.approx(scored["exact"] / 100)
    assert best["best_f1"] == pytest.approx(scored["best_f1"] / 100)


# ----------------------------------------------------------------------------- a sweep on Ray Tune


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_squad_sweep_runs_two_learning_rates_by_five_seeds_and_tracks_them(ray_local, tmp_path, exported,
                                                                             monkeypatch):
    tracking_uri, client, pretraining_run, grid = sweep_inputs(
        tmp_path, exported, monkeypatch, "spaces:\n  s: {epochs: [1], lr: [1.0e-3, 3.0e-3], batch_size: [32], "
        "warmup: [0.1],\n      max_length: 64, doc_stride: 16, max_question_length: 16}\ntasks: {squad_v2: s}\n")
    result = run(SweepOptions(source=pretraining_run, tasks="squad_v2", data_dir=str(FIXTURE), grid=str(grid),
                              seeds=(0, 1, 2, 3, 4), tracking_uri=tracking_uri, storage=str(tmp_path / "ray")))
    summary = result.tables.summary
    assert len(summary) == 2 and summary["complete"].all() and (summary["seeds_done"] == 5).all()
    table = result.tables.table.set_index("task")
    assert table.loc["SQuAD 2.0", "metric"] == "f1" and "exact_median" in table.columns
    assert "| SQuAD 2.0 | f1 |" in result.tables.markdown

    parent = client.get_run(result.run_id)
    assert parent.info.status == "FINISHED" and parent.data.params["max_length"] == "64"
    assert parent.data.metrics[best_task_metric("SQuAD 2.0", "median")] == pytest.approx(table.loc["SQuAD 2.0", "score_median"])
    assert parent.data.metrics[best_task_metric("SQuAD 2.0", "exact_median")] == pytest.approx(
        table.loc["SQuAD 2.0", "exact_median"])
    notes = client.download_artifacts(result.run_id, "data_notes.txt", str(tmp_path))
    assert re.search(r"SQuAD 2.0 \(span, score: f1\): train 24 questions in \d+ windows, dev 10 questions in",
                     Path(notes).read_text())
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{result.run_id}'", max_results=100)
    assert len(children) == 10 and all(c.info.status == "FINISHED" for c in children)
    child = children[0]
    assert child.data.params["task"] == "squad_v2" and child.data.params["max_length"] == "64"
    assert {"best.dev.f1", "best.dev.exact", "best.dev.no_ans_f1", "dev.f1"} <= set(child.data.metrics)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_squad_sweep_of_the_authors_checkpoint_encodes_with_their_tokenizer(ray_local, tmp_path, monkeypatch):
    """Their folder (tests/fixtures/official-cocolm) converted by the sweep: one short trial, windows of
    their ids (as many as `encode_task` makes with their scheme), scored officially."""
    authors = Path(__file__).parent / "fixtures" / "official-cocolm"
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    tracking_uri = empty_store(tmp_path)
    grid = tmp_path / "squad.yaml"
    grid.write_text("spaces:\n  s: {epochs: [1], lr: [1.0e-3], batch_size: [32], warmup: [0.1],\n"
                    "      max_length: 64, doc_stride: 16, max_question_length: 16}\ntasks: {squad_v2: s}\n")
    result = run(SweepOptions(source=str(authors), tasks="squad_v2", data_dir=str(FIXTURE), grid=str(grid),
                              seeds=(0,), tracking_uri=tracking_uri, storage=str(tmp_path / "ray")))
    assert result.tables.summary["complete"].all()
    client = MlflowClient(tracking_uri)
    windows = len(encode_task(read_squad_v2(FIXTURE), authors, **WINDOWS).train)
    notes = Path(client.download_artifacts(result.run_id, "data_notes.txt", str(tmp_path))).read_text()
    assert f"train 24 questions in {windows} windows" in notes
    child, = client.search_runs([client.get_run(result.run_id).info.experiment_id],
                                filter_string=f"tags.`mlflow.parentRunId` = '{result.run_id}'")
    assert child.info.status == "FINISHED" and 0 <= child.data.metrics["best.dev.f1"] <= 1
