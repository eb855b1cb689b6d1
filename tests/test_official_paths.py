"""SQuAD 2.0 windows, few-shot prompts, and the [CLS] readouts and probes with the authors' tokenizer scheme
(tests/fixtures/official-cocolm, through `jobs.data.tokens.Scheme`): their ids, special ids and [MASK] in
every sequence, answers read back through their pieces' character offsets, and the converted encoder's
[CLS] and mean vectors equal to the authors' own last hidden state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from model.classifier import load_encoder
from model.convert import from_official
from jobs.data.official_tokenizer import OfficialTokenizer
from jobs.finetuning.encoding import EncodedSplit, encode_task
from jobs.finetuning.fewshot import forms, split_data
from jobs.finetuning.prompts import Prompt, encode_prompts, prompt_for, prompt_input
from jobs.finetuning.tasks.snli import read_snli
from jobs.finetuning.tasks.specs import SNLI
from jobs.finetuning.tasks.squad import Question, Questions, read_squad_v2
from jobs.finetuning.tasks.squad_windows import best_answers, encode_questions
from jobs.finetuning.tasks.task import Split, Task
from jobs.studies import probe
from jobs.studies.represent import cls_vectors

FIXTURE = Path(__file__).parent / "fixtures" / "official-cocolm"
SQUAD = Path(__file__).parent / "fixtures" / "squad_v2"
WINDOWS = {"max_length": 64, "doc_stride": 16, "max_question_length": 16}  # several windows per paragraph
CASES = {case["id"]: case for case in json.loads((FIXTURE / "cases.json").read_text(encoding="utf-8"))["cases"]}
TOLERANCE = 1e-5  # as tests/test_convert.py: the authors' own rows differ by up to 7.2e-7
# With the fixture's 300 pieces two of the SQuAD fixture's answers are 31 and 32 pieces, beyond
# squad_windows.MAX_ANSWER_LENGTH.
LONG_ANSWERS = 64


@pytest.fixture(scope="module")
def official() -> OfficialTokenizer:
    return OfficialTokenizer(FIXTURE)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    return from_official(FIXTURE, tmp_path_factory.mktemp("official") / "converted")


@pytest.fixture(scope="module")
def authors_hidden() -> torch.Tensor:
    """Their last hidden state (4, 64, 32) of the batch of cases t29, p00, t13, t01, and its attention mask."""
    outputs = torch.load(FIXTURE / "outputs.pt", map_location="cpu", weights_only=True)
    return outputs["last_hidden_state"], outputs["attention_mask"].bool()


def windows_of(split: EncodedSplit) -> list[list[int]]:
    return [split.ids[split.offsets[w] : split.offsets[w + 1]].tolist() for w in range(len(split))]


def answers_at_the_labels(split: EncodedSplit) -> dict[str, str]:
    """What `best_answers` reads back when every window's logits point at its labelled start and end."""
    starts, ends = [], []
    for ids, (start, end) in zip(windows_of(split), split.labels.tolist()):
        s, e = np.full(len(ids), -10.0), np.full(len(ids), -10.0)
        s[start], e[end] = 10.0, 10.0
        starts.append(s)
        ends.append(e)
    return best_answers(split.spans, starts, ends, max_answer_length=LONG_ANSWERS)[0]


# ----------------------------------------------------------------------------- SQuAD 2.0


def test_squad_windows_are_the_authors_pair_layout_of_their_ids(official):
    task = read_squad_v2(SQUAD)
    encoded = encode_task(task, FIXTURE, **WINDOWS)
    split, spans = encoded.train, encoded.train.spans
    assert encoded.pad_id == official.pad_id == 1 and len(split) > len(task.train)  # several windows
    for w, ids in enumerate(windows_of(split)):
        question = task.train.items[int(spans.question[w])]
        asked, context = official.ids(question.question)[:16], official.ids(question.context)
        start, length = int(spans.token_start[w]), int(spans.length[w])
        assert ids == [0, *asked, 2, 2, *context[start : start + length], 2] and len(ids) <= 64
        assert int(spans.first[w]) == len(asked) + 3


def test_squad_labels_point_at_tokens_whose_characters_are_each_gold_answer():
    """Logits at each window's labels answer every question of the fixture with its gold text (and the
    unanswerable ones with none): the labels and the offsets agree with the characters."""
    task = read_squad_v2(SQUAD)
    encoded = encode_task(task, FIXTURE, **WINDOWS)
    for name, questions in (("train", task.train), ("dev", task.dev["dev"])):
        split = encoded.train if name == "train" else encoded.dev[name]
        assert answers_at_the_labels(split) == {q.id: q.answers[0][0] if q.answerable else "" for q in questions.items}


def test_answers_between_brown_quotes_curly_quotes_and_contractions_read_back_whole(official):
    context = ("  Critics called ``Yesterday'' a masterpiece.  It's by Paul McCartney;\tthe Beatles' “Help!” "
               "album—released in August 1965—held it. They ' re sure it ' s theirs.\n")
    answers = ["Yesterday", "``Yesterday''", "It's", "Paul McCartney", "“Help!”", "August 1965", "They ' re",
               "theirs"]
    questions = Questions([Question(f"q{i}", "Which words?", context, ((a, context.index(a)),))
                           for i, a in enumerate(answers)], "hand-made")
    sequences, labels, spans, _ = encode_questions(official, questions, 48, 8, 8)
    assert len(sequences) > len(answers)  # the paragraph takes several windows
    split = EncodedSplit(np.concatenate(sequences).astype(np.int32),
                         np.concatenate([[0], np.cumsum([len(s) for s in sequences])]), labels, spans)
    assert answers_at_the_labels(split) == {f"q{i}": a for i, a in enumerate(answers)}


# ----------------------------------------------------------------------------- few-shot


def test_few_shot_prompts_carry_the_authors_ids_their_specials_and_their_mask(official):
    task = read_snli()
    split = Split(["A man plays a guitar."], ["A person makes music."], [1], "x")
    data, notes = encode_prompts(official, prompt_for(task), task, split)
    assert data.special == {"[CLS]": 0, "[SEP]": 2, "[MASK]": 416, "[PAD]": 1} and official.mask_id == 416
    assert data.fields == [(official.ids("A man plays a guitar"), official.ids("A person makes music."))]
    assert data.pieces == ["text", official.ids("?"), "[MASK]", official.ids(","), "text_pair"]
    words = [prompt_for(task).label_words[label] for label in task.spec.labels]
    assert data.label_ids == [official.ids(word)[0] for word in words] and len(set(data.label_ids)) == 3
    assert notes == [f"label word {word!r} is {len(official.ids(word))} tokens here; scored by its first "
                     f"({official.token(official.ids(word)[0])!r})" for word in words if len(official.ids(word)) > 1]
    ids, position = prompt_input(data, 0, [0], data, max_length=64)
    assert ids[0] == 0 and ids[position] == 416 and ids.count(2) == 2 and ids.count(416) == 1


def test_few_shot_heads_read_the_authors_layout_and_pad(official):
    texts = [f"A sentence number {i}." for i in range(12)]
    train = Split(texts, [f"A second text {i}" for i in range(12)], [i % 3 for i in range(12)], "x")
    task = Task(SNLI, train, {"dev": train}, train.take([0, 1, 2]))
    prompt = Prompt("{text} ? [MASK] , {text_pair}", {"entailment": "Yes", "neutral": "Maybe", "contradiction": "No"})
    test = forms(official, task, {"test": task.test}, 32, prompt)
    data = split_data(task, 13, 2, official, 32, prompt, test)
    assert data.pad_id == 1 and data.prompt["train"].special["[MASK]"] == 416
    head = data.head["test"]
    assert head.ids[head.offsets[0] : head.offsets[1]].tolist() == official.encode(texts[0], "A second text 0", 32)


# ----------------------------------------------------------------------------- [CLS] readouts and probes


def test_cls_readouts_of_the_converted_encoder_are_the_authors_cls_vectors(converted, authors_hidden):
    hidden, _ = authors_hidden
    texts = [CASES[case]["text"] for case in ("t29", "t13", "t01")]  # rows 0, 2, 3 of their batch
    vectors = cls_vectors(load_encoder(converted), converted, texts, 64)
    assert (vectors - hidden[[0, 2, 3], 0]).abs().max().item() < TOLERANCE


def test_probes_of_the_converted_encoder_read_the_authors_vectors(converted, authors_hidden):
    hidden, mask = authors_hidden
    singles = Split([CASES[case]["text"] for case in ("t29", "t13", "t01")], None, [0, 1, 2], "cases")
    pair = Split([CASES["p00"]["text"]], [CASES["p00"]["text_pair"]], [0], "cases")
    task = Task(SNLI, singles, {"dev": pair}, singles)
    encoded = encode_task(task, converted, 64)
    encoder = load_encoder(converted)
    for split, rows in ((encoded.train, [0, 2, 3]), (encoded.dev["dev"], [1])):
        vectors = probe.features(encoder, split, encoded.pad_id)
        means = torch.stack([hidden[row][mask[row]].mean(0) for row in rows])
        assert np.abs(vectors["cls"] - hidden[rows, 0].numpy()).max() < TOLERANCE
        assert np.abs(vectors["mean"] - means.numpy()).max() < TOLERANCE
    details = probe.probe_encoder(converted, task, 64)
    assert details["pairs"] == {"train": 3, "dev": 1, "test": 3} and details["truncated"]["train"] == 1
