"""`python -m jobs.pretraining`: see jobs/pretraining/job.py."""

from jobs.cli import run_main
from jobs.pretraining.job import main

run_main(main)
