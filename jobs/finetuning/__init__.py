"""Stage 3, a pretrained encoder to scores: tasks, the fine-tuning trial, the grid, the Ray Tune sweep with
five seeds and its median tables (`python -m jobs.finetuning`)."""
