"""`python -m jobs.finetuning`: see jobs/finetuning/sweep.py."""

from jobs.cli import run_main
from jobs.finetuning.sweep import main

run_main(main)
