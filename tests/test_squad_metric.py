"""The SQuAD 2.0 metric against values worked out by hand (the arithmetic is in the comments), and the
`python -m jobs.evaluate_squad_v2` command run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.finetuning.tasks.squad import read_articles
from jobs.finetuning.tasks.squad_eval import evaluate, exact_match, gold_answers, normalize_answer, token_f1

ROOT = Path(__file__).resolve().parents[1]
BASE_KEYS = ["exact", "f1", "total"]
BREAKDOWN_KEYS = BASE_KEYS + ["HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total"]
BEST_KEYS = ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]

# Four questions used throughout; their per-question scores, worked out once:
#   q1 answerable,   gold "Eiffel Tower",              pred "Eiffel Tower" -> EM 1, F1 1
#   q2 answerable,   gold "the Eiffel Tower in Paris", pred "Eiffel Tower" -> EM 0, F1 2/3 (see test_partial_overlap)
#   q3 unanswerable, gold [""],                        pred ""             -> EM 1, F1 1
#   q4 unanswerable, gold [""],                        pred "Louvre"       -> EM 0, F1 0
GOLD = {"q1": ["Eiffel Tower"], "q2": ["the Eiffel Tower in Paris"], "q3": [""], "q4": [""]}
PREDICTIONS = {"q1": "Eiffel Tower", "q2": "Eiffel Tower", "q3": "", "q4": "Louvre"}
# No-answer probabilities; sorted: q1 0.1, q3 0.3, q2 0.4, q4 0.6.
NA_PROBS = {"q1": 0.1, "q2": 0.4, "q3": 0.3, "q4": 0.6}


# --- normalization ---------------------------------------------------------------------------------

def test_articles_are_removed_as_whole_words_only():
    assert normalize_answer("The cat") == "cat"
    assert exact_match("The cat", "cat") == 1
    assert normalize_answer("a cat and an owl") == "cat and owl"
    # "another" and "theme" contain "an" and "the" but not as words.
    assert normalize_answer("another theme") == "another theme"
    assert exact_match("another", "other") == 0


def test_punctuation_case_and_whitespace():
    assert normalize_answer("Paris.") == "paris"
    assert exact_match("Paris.", "paris") == 1
    assert normalize_answer("EIFFEL Tower") == "eiffel tower"
    assert normalize_answer("  New\tYork \n City ") == "new york city"
    # "The U.S." -> lower "the u.s." -> no punctuation "the us" -> no article " us" -> "us".
    assert normalize_answer("The U.S.") == "us"


def test_punctuation_goes_before_articles():
    # Official order: "a-n" loses its hyphen first and becomes the article "an", so nothing is left.
    # (Removing articles first would take the "a", then the punctuation, and leave "n".)
    assert normalize_answer("a-n") == ""
    assert normalize_answer("the.") == ""


# --- exact match and token F1 -------------------------------------------------------------------------

def test_partial_overlap():
    # gold "the Eiffel Tower in Paris" -> tokens [eiffel, tower, in, paris] (4); pred [eiffel, tower] (2);
    # shared 2: precision 2/2 = 1, recall 2/4 = 1/2, F1 = 2 * 1 * 1/2 / (1 + 1/2) = 1 / (3/2) = 2/3.
    assert exact_match("the Eiffel Tower in Paris", "Eiffel Tower") == 0
    assert token_f1("the Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    # The other way round precision and recall swap; F1 is symmetric: 2/3 again.
    assert token_f1("Eiffel Tower", "the Eiffel Tower in Paris") == pytest.approx(2 / 3)


def test_repeated_tokens_count_at_most_as_often_as_both_sides_have_them():
    # gold {paris: 2, france: 1}, pred {paris: 3}: shared min(2, 3) = 2; precision 2/3, recall 2/3,
    # F1 = 2 * (2/3)(2/3) / (4/3) = (8/9) / (4/3) = 2/3.
    assert token_f1("Paris Paris France", "Paris paris PARIS") == pytest.approx(2 / 3)


def test_no_overlap_and_empty_answers():
    assert token_f1("London", "Paris") == 0
    assert token_f1("", "") == 1  # both empty: they agree
    assert token_f1("Paris", "") == 0  # one empty: they do not
    assert token_f1("", "Paris") == 0
    assert token_f1("", "The.") == 1  # "The." normalizes to nothing
    assert exact_match("", "") == 1 and exact_match("", "Paris") == 0


def test_the_best_gold_answer_counts():
    gold = {"q": ["Denver Broncos", "the Broncos"]}
    # pred "Broncos team" [broncos, team]:
    #   vs [denver, broncos]: shared 1, precision 1/2, recall 1/2, F1 1/2
    #   vs [broncos] ("the" dropped): shared 1, precision 1/2, recall 1/1, F1 = 2 * 1/2 * 1 / (3/2) = 2/3
    # max F1 2/3 -> 66.67 %; EM 0 against both.
    result = evaluate(gold, {"q": "Broncos team"})
    assert result["exact"] == 0.0
    assert result["f1"] == pytest.approx(100 * 2 / 3)
    # pred "Broncos": EM 1 against "the Broncos" (0 against "Denver Broncos") -> 100 %.
    assert evaluate(gold, {"q": "Broncos"})["exact"] == 100.0


# --- gold answers from the official layout -----------------------------------------------------------

def squad_data() -> list[dict]:
    """The four questions of GOLD in the official SQuAD 2.0 layout (two articles)."""
    context = "Built for the World's Fair, the Eiffel Tower in Paris was finished in 1889."

    def qa(qid: str, question: str, answers: list[str]) -> dict:
        return {"id": qid, "question": question, "is_impossible": not answers,
                "answers": [{"text": a, "answer_start": context.find(a)} for a in answers]}

    return [
        {"title": "Eiffel_Tower", "paragraphs": [{"context": context, "qas": [
            qa("q1", "What was finished in 1889?", ["Eiffel Tower"]),
            qa("q2", "What is the landmark?", ["the Eiffel Tower in Paris"])]}]},
        {"title": "Louvre", "paragraphs": [{"context": context, "qas": [
            qa("q3", "When was the Louvre finished?", []),
            qa("q4", "Which museum opened in 1889?", [])]}]},
    ]


def test_gold_answers_keep_texts_that_survive_normalization():
    data = squad_data()
    data[0]["paragraphs"][0]["qas"][0]["answers"].append({"text": "The", "answer_start": 0})  # normalizes to ""
    assert gold_answers(data) == GOLD
    # A question whose only answer normalizes to nothing is left with the empty answer.
    only_article = [{"title": "t", "paragraphs": [{"context": "c", "qas": [
        {"id": "x", "question": "?", "answers": [{"text": "A.", "answer_start": 0}]}]}]}]
    assert gold_answers(only_article) == {"x": [""]}


def test_malformed_data_is_a_value_error():
    with pytest.raises(ValueError, match="malformed SQuAD data"):
        gold_answers([{"title": "t", "paragraphs": [{"qas": [{"question": "no id"}]}]}])


def test_the_one_squad_reader_names_the_broken_file(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": [', encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        read_articles(broken)
    no_data = tmp_path / "no_data.json"
    no_data.write_text('{"version": "v2.0"}', encoding="utf-8")
    with pytest.raises(ValueError, match='no_data.json: not a SQuAD data file'):
        read_articles(no_data)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"version": "v2.0", "data": squad_data()}), encoding="utf-8")
    assert gold_answers(read_articles(good)) == GOLD


# --- evaluate -----------------------------------------------------------------------------------------

def test_unanswerable_questions():
    gold = {"yes": ["Paris"], "no": [""]}
    # Unanswerable with the empty prediction: EM = F1 = 1; answerable with the empty prediction: 0.
    result = evaluate(gold, {"yes": "", "no": ""})
    assert (result["HasAns_exact"], result["HasAns_f1"]) == (0.0, 0.0)
    assert (result["NoAns_exact"], result["NoAns_f1"]) == (100.0, 100.0)
    # Unanswerable with an answer: 0.
    result = evaluate(gold, {"yes": "Paris", "no": "Paris"})
    assert (result["NoAns_exact"], result["NoAns_f1"]) == (0.0, 0.0)


def test_has_answer_and_no_answer_breakdown():
    result = evaluate(GOLD, PREDICTIONS)
    assert list(result) == BREAKDOWN_KEYS
    # all:    EM (1 + 0 + 1 + 0) / 4 = 50 %;       F1 (1 + 2/3 + 1 + 0) / 4 = (8/3) / 4 = 2/3 = 66.67 %
    # HasAns: EM (1 + 0) / 2 = 50 %;               F1 (1 + 2/3) / 2 = 5/6 = 83.33 %
    # NoAns:  EM (1 + 0) / 2 = 50 %;               F1 (1 + 0) / 2 = 50 %
    assert result["exact"] == 50.0 and result["f1"] == pytest.approx(100 * 2 / 3) and result["total"] == 4
    assert result["HasAns_exact"] == 50.0 and result["HasAns_f1"] == pytest.approx(100 * 5 / 6)
    assert result["NoAns_exact"] == 50.0 and result["NoAns_f1"] == 50.0
    assert result["HasAns_total"] == 2 and result["NoAns_total"] == 2


def test_a_side_with_no_questions_has_no_keys():
    result = evaluate({"q1": GOLD["q1"], "q2": GOLD["q2"]}, PREDICTIONS)
    assert list(result) == BASE_KEYS + ["HasAns_exact", "HasAns_f1", "HasAns_total"]
    assert list(evaluate({"q3": [""]}, PREDICTIONS)) == BASE_KEYS + ["NoAns_exact", "NoAns_f1", "NoAns_total"]


def test_missing_predictions_are_left_out_and_named(capsys):
    result = evaluate(GOLD, {"q1": "Eiffel Tower", "q3": ""})
    # Only q1 (EM 1, F1 1) and q3 (EM 1, F1 1) are scored: 100 % over a total of 2.
    assert result["total"] == 2 and result["exact"] == 100.0
    assert result["HasAns_total"] == 1 and result["NoAns_total"] == 1
    err = capsys.readouterr().err
    assert err.startswith("2 question(s) have no prediction; they are left out of every score: q2, q4")
    with pytest.raises(ValueError, match="no question"):
        evaluate(GOLD, {"other": "x"})


def test_the_missing_ids_listed_stop_at_five(capsys):
    evaluate({f"q{i}": ["x"] for i in range(8)}, {"q0": "x"})
    assert capsys.readouterr().err.strip().endswith("q1, q2, q3, q4, q5, ...")


def test_best_thresholds():
    result = evaluate(GOLD, PREDICTIONS, NA_PROBS)
    assert list(result) == BREAKDOWN_KEYS + BEST_KEYS
    # Start abstaining everywhere: the 2 unanswerable questions score, current = 2, threshold 0.0.
    # Walk by probability, answering one more question each step:
    #   EM: q1 (0.1, answerable, 1) -> 3, best, thresh 0.1; q3 (0.3, unanswerable, pred "") -> +0 = 3;
    #       q2 (0.4, answerable, 0) -> 3; q4 (0.6, unanswerable, pred "Louvre") -> -1 = 2.
    #       best_exact = 3 / 4 = 75 %, threshold 0.1.
    #   F1: q1 -> 3 (thresh 0.1); q3 -> 3; q2 -> 3 + 2/3 = 11/3 > 3, best, thresh 0.4; q4 -> 8/3.
    #       best_f1 = (11/3) / 4 = 11/12 = 91.67 %, threshold 0.4.
    assert result["best_exact"] == 75.0 and result["best_exact_thresh"] == 0.1
    assert result["best_f1"] == pytest.approx(100 * 11 / 12) and result["best_f1_thresh"] == 0.4
    # The default threshold 1.0 abstains nowhere: the plain scores are those without probabilities.
    assert result["exact"] == 50.0 and result["f1"] == pytest.approx(100 * 2 / 3)


def test_the_no_answer_threshold_turns_confident_abstentions_into_empty_answers():
    result = evaluate(GOLD, PREDICTIONS, NA_PROBS, na_prob_thresh=0.35)
    # Above 0.35: q2 (0.4, answerable) now scores 0 / 0; q4 (0.6, unanswerable) now scores 1 / 1.
    # all: EM (1 + 0 + 1 + 1) / 4 = 75 %, F1 (1 + 0 + 1 + 1) / 4 = 75 %
    # HasAns: (1 + 0) / 2 = 50 % both; NoAns: (1 + 1) / 2 = 100 % both.
    assert (result["exact"], result["f1"]) == (75.0, 75.0)
    assert (result["HasAns_exact"], result["HasAns_f1"]) == (50.0, 50.0)
    assert (result["NoAns_exact"], result["NoAns_f1"]) == (100.0, 100.0)
    # The best-threshold search starts from the raw scores, so it is the same as in test_best_thresholds.
    assert result["best_exact"] == 75.0 and result["best_f1"] == pytest.approx(100 * 11 / 12)


def test_the_threshold_search_tests_the_raw_prediction_string():
    # As the official script does: an unanswerable question answered "." scores EM 1 ("." normalizes to
    # nothing), yet answering it costs the search a point because "." is a non-empty string.
    gold = {"yes": ["Paris"], "no": [""]}
    result = evaluate(gold, {"yes": "Paris", "no": "."}, {"no": 0.2, "yes": 0.5})
    assert result["exact"] == 100.0
    # Start 1 (one unanswerable); "no" (0.2) -> 1 - 1 = 0; "yes" (0.5) -> 0 + 1 = 1, not above 1.
    # best_exact = 1 / 2 = 50 % at the starting threshold 0.0.
    assert result["best_exact"] == 50.0 and result["best_exact_thresh"] == 0.0


def test_probabilities_must_cover_every_scored_question():
    with pytest.raises(ValueError, match="1 question.* no no-answer probability: q4"):
        evaluate(GOLD, PREDICTIONS, {"q1": 0.1, "q2": 0.4, "q3": 0.3})


def test_a_negative_threshold_without_probabilities_abstains_everywhere():
    # As the official script: without a file every probability is 0.0, and 0.0 > -1 abstains, so the
    # answerable question scores 0 even though its prediction is right.
    assert evaluate({"q": ["Paris"]}, {"q": "Paris"}, na_prob_thresh=-1.0)["exact"] == 0.0


# --- the command ----------------------------------------------------------------------------------------

def run_command(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.evaluate_squad_v2", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def test_command_end_to_end(tmp_path):
    data = write_json(tmp_path / "dev-v2.0.json", {"version": "v2.0", "data": squad_data()})
    preds = write_json(tmp_path / "predictions.json", PREDICTIONS)
    na_probs = write_json(tmp_path / "na_probs.json", NA_PROBS)
    out = tmp_path / "eval.json"
    result = run_command(data, preds, "--na-prob-file", na_probs, "--out-file", out)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert list(printed) == BREAKDOWN_KEYS + BEST_KEYS
    # The values of test_has_answer_and_no_answer_breakdown and test_best_thresholds.
    expected = {"exact": 50.0, "f1": 100 * 2 / 3, "total": 4,
                "HasAns_exact": 50.0, "HasAns_f1": 100 * 5 / 6, "HasAns_total": 2,
                "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
                "best_exact": 75.0, "best_exact_thresh": 0.1, "best_f1": 100 * 11 / 12, "best_f1_thresh": 0.4}
    assert printed == pytest.approx(expected)
    assert json.loads(out.read_text(encoding="utf-8")) == printed

    # --na-prob-thresh 0.35: the values of test_the_no_answer_threshold_turns_confident_abstentions_into_empty_answers.
    thresholded = json.loads(run_command(data, preds, "--na-prob-file", na_probs, "--na-prob-thresh", "0.35").stdout)
    assert (thresholded["exact"], thresholded["NoAns_exact"]) == (75.0, 100.0)
    # Without probabilities: no best_* keys.
    assert list(json.loads(run_command(data, preds).stdout)) == BREAKDOWN_KEYS


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and "--debug" in lines[1], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0]


def test_command_reports_broken_and_missing_files(tmp_path):
    data = write_json(tmp_path / "dev.json", {"version": "v2.0", "data": squad_data()})
    preds = write_json(tmp_path / "predictions.json", PREDICTIONS)
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": "v2.0", "data": [', encoding="utf-8")
    assert_one_line_error(run_command(broken, preds), str(broken), "not valid JSON")
    assert_one_line_error(run_command(data, tmp_path / "absent.json"), "No such file", "absent.json")
    not_a_mapping = write_json(tmp_path / "list.json", ["Eiffel Tower"])
    assert_one_line_error(run_command(data, not_a_mapping), str(not_a_mapping), "expected a JSON object")
    bad_prob = write_json(tmp_path / "na.json", {**NA_PROBS, "q2": "high"})
    assert_one_line_error(run_command(data, preds, "--na-prob-file", bad_prob), "'q2'", "not a number")
