"""Score SQuAD 2.0 predictions as the official evaluation script does (jobs/finetuning/squad_metric.py).

    python -m jobs.evaluate_squad_v2 DATA.json PREDICTIONS.json [--na-prob-file NA_PROBS.json]
        [--na-prob-thresh 1.0] [--out-file eval.json]

DATA.json is an official SQuAD 2.0 file; PREDICTIONS.json maps each question id to the predicted answer
text ("" to abstain); NA_PROBS.json maps each question id to the model's no-answer probability, which
adds the best_exact / best_f1 keys and lets --na-prob-thresh turn confident abstentions into empty
answers. Prints the result as JSON with the official script's keys and, with --out-file, writes it there
too. A missing or malformed file is one line on stderr and exit status 1 (`jobs.cli.run_main`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jobs.cli import run_main
from jobs.finetuning.squad_metric import evaluate, gold_answers, read_dataset

PROG = "python -m jobs.evaluate_squad_v2"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    gold = gold_answers(read_dataset(args.data_file))
    predictions = read_mapping(args.pred_file, str, "answer text")
    na_probs = None if args.na_prob_file is None else read_mapping(args.na_prob_file, (int, float), "number")
    result = evaluate(gold, predictions, na_probs, args.na_prob_thresh)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out_file is not None:
        args.out_file.write_text(text + "\n", encoding="utf-8")
    return result


def read_mapping(path: Path, kind: type | tuple[type, ...], described: str) -> dict[str, Any]:
    """A JSON object whose values are all of `kind`; anything else is a ValueError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            mapping = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(mapping, dict):
        raise ValueError(f"{path}: expected a JSON object mapping question id to {described}")
    for qid, value in mapping.items():
        # bool is an int to Python but never a probability.
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"{path}: the value for question {qid!r} is {value!r}, not a {described}")
    return mapping


if __name__ == "__main__":
    run_main(main)
