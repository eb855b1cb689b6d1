"""`python -m jobs.evaluate_squad_v2 DATA.json PREDICTIONS.json [...]`: the official SQuAD 2.0 evaluation as a
command; see jobs/finetuning/tasks/squad_eval.py."""

from jobs.cli import run_main
from jobs.finetuning.tasks.squad_eval import main

if __name__ == "__main__":
    run_main(main)
