"""SQuAD 2.0 scores, computed as the official evaluation script of the SQuAD 2.0 benchmark does, and that
evaluation as a command (`python -m jobs.evaluate_squad_v2`, `main` below).

Every question gets two scores against its gold answers, each the maximum over the gold answers:

- exact match (EM): 1 when the prediction and a gold answer are the same string once both are
  normalized (lower case, punctuation removed, the articles "a", "an", "the" removed as whole words,
  runs of whitespace collapsed to one space), else 0;
- token F1: the harmonic mean of precision and recall over the bag of normalized tokens the two share.

An unanswerable question's only gold answer is the empty string, so it scores 1 exactly when the
prediction normalizes to nothing (an empty prediction, or one made only of punctuation and articles).
Because F1 over two empty token lists is defined as 1 when both are empty and 0 when only one is, an
answerable question answered with the empty string scores 0.

`evaluate` reports the means in percent over all questions, then over the answerable ("HasAns") and
the unanswerable ("NoAns") ones. Given each question's no-answer probability, it also

- replaces the prediction by the empty answer wherever that probability exceeds `na_prob_thresh`
  (the default 1.0 never does, as no probability exceeds 1), and
- reports the best EM and F1 any threshold would have reached (`best_exact`, `best_f1`) and the
  threshold that reaches them: the score obtained by answering only the questions whose probability
  is at most that threshold and abstaining (the empty answer) on the rest.

Questions without a prediction are left out of every score and every total. (The official script
skips them when scoring, warning once per question, but then fails on them in the HasAns / NoAns
breakdown; skipping them throughout is the consistent reading.) Predictions for ids that are not in
the gold data are ignored, as there.

One case differs from the official script by construction: it calls a question answerable when its
list of answers is non-empty, while `evaluate` here knows only the gold texts that `gold_answers`
kept, so a question whose every gold answer normalizes to nothing (an answer such as "The") counts
as unanswerable. Only such degenerate gold answers show the difference.
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jobs.cli import UserError
from jobs.finetuning.tasks.squad import read_articles

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
# The gold list of an unanswerable question: the empty answer is the only right one.
NO_ANSWER = [""]
# How many missing question ids the warning names before it stops listing them.
_LISTED_MISSING = 5


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation, drop the articles a/an/the (whole words only, so "another" keeps
    its "an"), collapse whitespace: the official order, which matters ("the." loses its dot first and
    then is an article)."""
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(gold: str, pred: str) -> int:
    """1 when the two answers are equal after normalization, else 0."""
    return int(normalize_answer(gold) == normalize_answer(pred))


def token_f1(gold: str, pred: str) -> float:
    """F1 over the normalized tokens the two answers share (counting repeats at most as often as
    both sides have them). When either side has no tokens, 1 if both have none, else 0."""
    gold_tokens = normalize_answer(gold).split()
    pred_tokens = normalize_answer(pred).split()
    if not gold_tokens or not pred_tokens:
        return int(gold_tokens == pred_tokens)
    shared = sum((Counter(gold_tokens) & Counter(pred_tokens)).values())
    if shared == 0:
        return 0
    precision = shared / len(pred_tokens)
    recall = shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers(dataset: list[dict]) -> dict[str, list[str]]:
    """Question id -> its gold answer texts, in the order of the data, from the `data` list of an
    official file (articles -> paragraphs -> qas -> answers). Texts that normalize to nothing are
    dropped; a question left with none (an unanswerable one) gets `[""]`."""
    gold: dict[str, list[str]] = {}
    try:
        for article in dataset:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    gold[qa["id"]] = gold_texts(a["text"] for a in qa["answers"])
    except (KeyError, TypeError, AttributeError) as error:
        raise UserError(f"malformed SQuAD data: expected articles -> paragraphs -> qas (id, answers -> text); "
                         f"{type(error).__name__}: {error}") from error
    return gold


def gold_texts(texts: Iterable[str]) -> list[str]:
    """The official rule for one question: its answer texts that normalize to something, `[""]` when
    none does. Training's windows (squad_windows.py) keep their gold by the same rule."""
    return [text for text in texts if normalize_answer(text)] or list(NO_ANSWER)


def evaluate(gold: dict[str, list[str]], predictions: dict[str, str], na_probs: dict[str, float] | None = None,
             na_prob_thresh: float = 1.0) -> dict[str, float]:
    """The official result: `exact`, `f1`, `total`, then the same three prefixed `HasAns_` and
    `NoAns_` (each only when such questions were scored), then, when `na_probs` is given,
    `best_exact`, `best_exact_thresh`, `best_f1`, `best_f1_thresh`. Scores are percentages; the
    totals count the scored questions (those with a prediction)."""
    scored = [qid for qid in gold if qid in predictions]
    _warn_missing([qid for qid in gold if qid not in predictions])
    if not scored:
        raise UserError("no question of the gold data has a prediction")
    has_answer = {qid: gold[qid] != NO_ANSWER for qid in scored}
    exact_raw = {qid: max(exact_match(g, predictions[qid]) for g in gold[qid]) for qid in scored}
    f1_raw = {qid: max(token_f1(g, predictions[qid]) for g in gold[qid]) for qid in scored}
    # Without probabilities the official script uses 0.0 for every question, so a negative threshold
    # still turns every prediction into an abstention there; keep that.
    probs = dict.fromkeys(scored, 0.0) if na_probs is None else _probs_for(scored, na_probs)
    exact = _apply_no_answer_threshold(exact_raw, probs, has_answer, na_prob_thresh)
    f1 = _apply_no_answer_threshold(f1_raw, probs, has_answer, na_prob_thresh)

    result: dict[str, Any] = OrderedDict(_means(exact, f1, scored))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        subset = [qid for qid in scored if has_answer[qid] == wanted]
        if subset:
            result.update((f"{prefix}_{key}", value) for key, value in _means(exact, f1, subset).items())
    if na_probs is not None:
        # The search starts from the raw scores: it asks what each threshold would have given.
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(predictions, exact_raw, na_probs, has_answer)
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(predictions, f1_raw, na_probs, has_answer)
    return result


def _warn_missing(missing: list[str]) -> None:
    """One line on stderr naming (the first few of) the questions that have no prediction."""
    if not missing:
        return
    listed = ", ".join(missing[:_LISTED_MISSING]) + (", ..." if len(missing) > _LISTED_MISSING else "")
    print(f"{len(missing)} question(s) have no prediction; they are left out of every score: {listed}",
          file=sys.stderr)


def _probs_for(scored: list[str], na_probs: dict[str, float]) -> dict[str, float]:
    """The no-answer probability of every scored question; a gap is an error (the official script
    fails on it too)."""
    absent = [qid for qid in scored if qid not in na_probs]
    if absent:
        listed = ", ".join(absent[:_LISTED_MISSING]) + (", ..." if len(absent) > _LISTED_MISSING else "")
        raise UserError(f"{len(absent)} question(s) have a prediction but no no-answer probability: {listed}")
    return {qid: na_probs[qid] for qid in scored}


def _apply_no_answer_threshold(scores: dict[str, float], probs: dict[str, float], has_answer: dict[str, bool],
                               threshold: float) -> dict[str, float]:
    """Above the threshold the model abstains: the question then scores 1 when unanswerable, else 0."""
    return {qid: float(not has_answer[qid]) if probs[qid] > threshold else score for qid, score in scores.items()}


def _means(exact: dict[str, float], f1: dict[str, float], qids: list[str]) -> dict[str, float]:
    """exact, f1 (percent) and total over `qids`, summed in the order given (the official order)."""
    total = len(qids)
    return {"exact": 100.0 * sum(exact[q] for q in qids) / total,
            "f1": 100.0 * sum(f1[q] for q in qids) / total,
            "total": total}


def _best_threshold(predictions: dict[str, str], scores: dict[str, float], na_probs: dict[str, float],
                    has_answer: dict[str, bool]) -> tuple[float, float]:
    """The best score (percent) over all no-answer thresholds, and the threshold reaching it.

    A threshold t means: answer the questions whose probability is <= t, abstain on the others.
    Start from abstaining everywhere (each unanswerable question scores 1) and lower the bar one
    question at a time in order of increasing probability: answering an answerable question gains
    its score; answering an unanswerable one loses its point when the raw prediction is non-empty
    (the official script tests the raw string, not its normalized form). Only a strict improvement
    moves the best threshold, so ties keep the lower one, and it stays 0.0 when abstaining
    everywhere is best."""
    current = sum(1 for answerable in has_answer.values() if not answerable)
    best, best_thresh = current, 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):  # stable: ties keep the file's order
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_thresh = current, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


# ----------------------------------------------------------------------------- the command


PROG = "python -m jobs.evaluate_squad_v2"
COMMAND = """Score SQuAD 2.0 predictions as the official evaluation script does.

    python -m jobs.evaluate_squad_v2 DATA.json PREDICTIONS.json [--na-prob-file NA_PROBS.json]
        [--na-prob-thresh 1.0] [--out-file eval.json]

DATA.json is an official SQuAD 2.0 file; PREDICTIONS.json maps each question id to the predicted answer
text ("" to abstain); NA_PROBS.json maps each question id to the model's no-answer probability, which
adds the best_exact / best_f1 keys and lets --na-prob-thresh turn confident abstentions into empty
answers. Prints the result as JSON with the official script's keys and, with --out-file, writes it there
too. A missing or malformed file is one line on stderr and exit status 1 (`jobs.cli.run_main`).
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=COMMAND, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_file", type=Path, help="the official SQuAD 2.0 JSON file (version, data)")
    parser.add_argument("pred_file", type=Path, help="JSON object: question id -> predicted answer text")
    parser.add_argument("--na-prob-file", type=Path, default=None, help="JSON object: question id -> no-answer probability")
    parser.add_argument("--na-prob-thresh", type=float, default=1.0,
                        help="abstain (predict the empty answer) where the no-answer probability exceeds this "
                             "(default 1.0: never)")
    parser.add_argument("--out-file", type=Path, default=None, help="also write the result (JSON) to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    gold = gold_answers(read_articles(args.data_file))
    predictions = read_mapping(args.pred_file, str, "answer text")
    na_probs = None if args.na_prob_file is None else read_mapping(args.na_prob_file, (int, float), "number")
    result = evaluate(gold, predictions, na_probs, args.na_prob_thresh)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out_file is not None:
        args.out_file.write_text(text + "\n", encoding="utf-8")
    return result


def read_mapping(path: Path, kind: type | tuple[type, ...], described: str) -> dict[str, Any]:
    """A JSON object whose values are all of `kind`; anything else is a UserError naming the file."""
    try:
        mapping = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(mapping, dict):
        raise UserError(f"{path}: expected a JSON object mapping question id to {described}")
    for qid, value in mapping.items():
        # bool is an int to Python but never a probability.
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UserError(f"{path}: the value for question {qid!r} is {value!r}, not a {described}")
    return mapping
