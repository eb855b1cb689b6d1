"""The benchmark beside the model: the pretraining job's own step timed on random tokens, against
transformers peers (`python -m bench`, `bench.cli`), attention alone (`bench.attention`) and the GPU
report (`bench.gpu_report`). It reads the job's presets through the job's one resolver
(`jobs.pretraining.config`) and needs torch and transformers only: no Ray, no MLflow, no pandas."""
