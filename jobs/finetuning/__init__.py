"""Stage 3, a pretrained encoder to scores: the tasks (tasks/), one fine-tuning loop (engine.py) under the [CLS]
trial and the few-shot trial, and the two Ray Tune jobs on one machinery (tune.py): the sweep with five seeds and
its median tables (`python -m jobs.finetuning`) and the few-shot study (`python -m jobs.finetuning.fewshot`)."""
