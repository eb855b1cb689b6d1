"""Stage 2, batches to a pretrained encoder: the run config, the Ray Train loop, checkpoints, the job
(`python -m jobs.pretraining`) and the pretrained encoders it leaves or starts from (`encoders.py`)."""
