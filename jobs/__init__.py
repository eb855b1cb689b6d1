"""What runs on Ray: the Ray Data stream, the Ray Train loop, the Ray Tune sweep, tokenizer
training, MLflow tracking and the command-line entry points (`python -m jobs.<name>`)."""
