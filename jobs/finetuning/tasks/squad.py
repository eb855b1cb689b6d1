"""SQuAD 2.0 (docs/method.md section 7.6): the official JSON files read into questions.

    read_squad_v2(data_dir) -> Task   # <data_dir>/train-v2.0.json and <data_dir>/dev-v2.0.json
    read_articles(path) -> list       # the one reader of a file, for training and for the official evaluation

Questions become model windows in squad_windows.py; the official evaluation is squad_eval.py.

The files are the official ones (`{"version": "v2.0", "data": [article, ...]}`, an article has a
`title` and `paragraphs`, a paragraph a `context` and `qas`, a question an `id`, `question`,
`answers` [{`text`, `answer_start`}] and `is_impossible`). The platform cannot download them; users
fetch them from `SQUAD_URL` (docs, README).

A question is **unanswerable** when it has no answers and `is_impossible` is true. An answerable
question needs at least one answer whose text sits in the context at its `answer_start`: training
uses the first such answer, and the metric every answer's text.

**Malformed entries** (a paragraph without context, a question without id or text, answers that
contradict `is_impossible`, an answer that is not where it says) are skipped and reported by file
and JSON position, as the GLUE readers report lines; a file with more than
`MAX_MALFORMED_FRACTION` of its questions malformed is an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobs.cli import UserError
from jobs.finetuning.tasks.specs import SQUAD_V2
from jobs.finetuning.tasks.task import SkippedRow, Task, check_malformed_fraction

SQUAD_FILES = {"train": "train-v2.0.json", "dev": "dev-v2.0.json"}
SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/"


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    context: str  # the paragraph; questions of one paragraph share the string
    answers: tuple[tuple[str, int], ...]  # (text, character start in context); () when unanswerable

    @property
    def answerable(self) -> bool:
        return bool(self.answers)

    def span(self) -> tuple[int, int]:
        """The character span [start, end) of the first answer, the one training uses."""
        text, start = self.answers[0]
        return start, start + len(text)


@dataclass(frozen=True)
class Questions:
    """A SQuAD split: `len` and `take` as `task.Split` has them, so subsets work the same way."""

    items: list[Question]
    source: str

    def __len__(self) -> int:
        return len(self.items)

    def take(self, indices: Sequence[int]) -> Questions:
        return Questions([self.items[i] for i in indices], self.source)


def read_squad_v2(data_dir: str | Path | None) -> Task:
    """Train and dev of SQuAD 2.0 from `data_dir`; a clear error when the files are not there."""
    if data_dir is None:
        raise UserError(f"SQuAD 2.0 needs --data-dir: the platform never downloads it. Get "
                         f"{SQUAD_FILES['train']} and {SQUAD_FILES['dev']} from {SQUAD_URL} into one folder "
                         f"and pass it as --data-dir (see the README)")
    paths = {split: Path(data_dir) / name for split, name in SQUAD_FILES.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise UserError(f"SQuAD 2.0 file(s) {missing} not found: download them from {SQUAD_URL} "
                                f"into --data-dir")
    train, skipped = read_squad_file(paths["train"])
    dev, more = read_squad_file(paths["dev"])
    return Task(SQUAD_V2, train, {"dev": dev}, skipped=tuple(skipped + more))


def read_squad_file(path: str | Path) -> tuple[Questions, list[SkippedRow]]:
    """Every well-formed question of one official file, and the skipped entries."""
    items, skipped = [], []
    for where, entry in _entries(read_articles(path)):
        if isinstance(entry, str):
            skipped.append(SkippedRow(str(path), where, entry))
        else:
            items.append(entry)
    if not items:
        raise UserError(f"{path}: no usable questions ({len(skipped)} malformed)")
    check_malformed_fraction(str(path), SQUAD_V2, skipped, len(items) + len(skipped))
    return Questions(items, str(path)), skipped


def read_articles(path: str | Path) -> list:
    """The `data` list (the articles) of an official SQuAD JSON file `{"version": ..., "data": [...]}`;
    a file that cannot be read or is not one is a UserError naming it."""
    try:
        document = json.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: not valid JSON ({error})") from error
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise UserError(f'{path}: not a SQuAD data file (expected an object with a "data" list of articles)')
    return data


def _entries(articles: list) -> Iterator[tuple[str, Question | str]]:
    """(JSON position, a question or why the entry is malformed), in file order."""
    for a, article in enumerate(articles):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            yield f"data[{a}]", "an article without a `paragraphs` list"
            continue
        for p, paragraph in enumerate(paragraphs):
            where = f"data[{a}].paragraphs[{p}]"
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            if not isinstance(context, str) or not context.strip() or not isinstance(qas, list):
                yield where, "a paragraph without a `context` string and a `qas` list"
                continue
            for q, qa in enumerate(qas):
                yield f"{where}.qas[{q}]", _question(qa, context)


def _question(qa, context: str) -> Question | str:
    if not isinstance(qa, dict):
        return "not a JSON object"
    qid, text, answers = qa.get("id"), qa.get("question"), qa.get("answers", [])
    if not isinstance(qid, str) or not qid or not isinstance(text, str) or not text.strip():
        return "no `id` or no `question` text"
    if not isinstance(answers, list) or not all(
            isinstance(x, dict) and isinstance(x.get("text"), str) and isinstance(x.get("answer_start"), int)
            for x in answers):
        return "`answers` is not a list of {text, answer_start}"
    impossible = qa.get("is_impossible", not answers)
    if impossible is not (not answers):  # an unanswerable question has no answers and says so
        return "`is_impossible` contradicts `answers`"
    found = tuple((x["text"], x["answer_start"]) for x in answers)
    if found and not any(t.strip() and context[s : s + len(t)] == t for t, s in found):
        return "no answer text is in the context at its `answer_start`"
    # Training reads the first answer: put the first one that is where it says in front.
    found = tuple(sorted(found, key=lambda x: context[x[1] : x[1] + len(x[0])] != x[0]))
    return Question(qid, text, context, found)
