"""Stage 2, batches to a pretrained encoder: the run config, the Ray Train loop, checkpoints and the job
(`python -m jobs.pretraining`)."""
