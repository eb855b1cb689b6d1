"""Every MLflow name the jobs write and analysis/ reads back: tags, their values, metric keys.

Writers and readers import these instead of spelling a string twice. No imports: the fine-tuning
trial, which runs without Ray or MLflow, and the torch-free analysis/ both use this module.
"""

from __future__ import annotations

# Default experiments, one per stage.
PRETRAINING_EXPERIMENT = "pretraining"
FINETUNING_EXPERIMENT = "finetuning"
ANALYSIS_EXPERIMENT = "analysis"
FEWSHOT_EXPERIMENT = "fewshot"

RUN_KEY_TAG = "cocolm.run_key"  # the Ray run name: the same command re-run finds its MLflow run by it
KIND_TAG = "kind"  # one of the KIND_* values below
KIND_PRETRAINING = "pretraining"
KIND_SWEEP = "finetuning-sweep"  # a sweep's parent run
KIND_TRIAL = "finetuning-trial"  # one attempt of one trial, a child of its sweep
KIND_ANALYSIS = "analysis"  # a report's figures and tables
KIND_FEWSHOT = "fewshot-study"  # a few-shot study's parent run (jobs.finetuning.fewshot); its trials are KIND_TRIAL
PRETRAINING_TAG = "cocolm.pretraining_run"  # on a sweep parent: the pretraining run it fine-tunes
CHECKPOINT_TAG = "cocolm.checkpoint"  # on a finished pretraining run: its final checkpoint
STOP_TAG = "cocolm.stopped"  # set when the pretraining loop stops itself (non-finite loss), with the reason
# On a pretraining run, from its first log line on: which attention its encoders ran per kind of pass, after
# any fallback (model.encoder.attention_ran), and every fallback with its cause, or "none".
ATTENTION_TAG = "cocolm.attention"
ATTENTION_FALLBACKS_TAG = "cocolm.attention_fallbacks"
# On a pretraining run: what its steps computed in, "bf16" (autocast) or "fp32" (model.step.step_precision: a
# CPU without native bf16 runs fp32 even where train.bf16_on_cpu asks for bf16).
PRECISION_TAG = "cocolm.precision"
TRIAL_TAG = "cocolm.trial"  # on a trial run: the trial's name (task, grid point, seed)
ERROR_TAG = "cocolm.error"  # on a failed trial run: the first line of its error
ATTEMPT_TAG = "cocolm.attempt"  # on a trial run: which attempt of the trial it records (1, 2, ...)
PRETRAINING_SEED_TAG = "pretraining_seed"  # on pretraining runs of a study: the seed of init, corruption and data order
GATE_TAG = "cocolm.gate"  # on a study's pretraining runs: "trained", or which criterion failed (jobs.gate)
STUDY_TAGS = ("preset", "variant")  # on pretraining runs, and copied to their sweeps: the compare view's columns
# jobs.studies.represent, logged on the pretraining run it measures:
REPRESENT_METRICS = ("represent/random_cosine_mean", "represent/similar_cosine_mean", "represent/cosine_gap")
REPRESENT_ARTIFACT = "represent/cosines.csv"  # one row per sentence pair (kind, cosine)
RANDOM_INIT_VARIANT = "random_init"  # jobs.studies.control: the preset's encoder at initialisation, never trained
# jobs.studies.probe, logged on the pretraining run it measures: linear probes on the frozen encoder's
# [CLS] and mean-pooled last layer, fitted on SNLI train, C chosen on dev, scored on the whole test split.
PROBE_FEATURES = ("cls", "mean")
PROBE_METRICS = ("probe/cls_test_accuracy", "probe/mean_test_accuracy")  # the reported numbers, in PROBE_FEATURES order
PROBE_DEV_METRICS = ("probe/cls_dev_accuracy", "probe/mean_dev_accuracy")  # the chosen C's, selection only
PROBE_SIZE_METRICS = ("probe/train_pairs", "probe/dev_pairs", "probe/test_pairs")
PROBE_ARTIFACT = "probe/probe.json"  # per feature: chosen C, accuracy per C, test confusion matrix; sizes, seconds


def best_split_metric(split: str, metric: str) -> str:
    """A trial's best dev value of `metric` on `split` (e.g. best.dev.accuracy), over its evaluations."""
    return f"best.{split}.{metric}"


def best_task_metric(task: str, stat: str) -> str:
    """On a sweep parent: `stat` (median, min, max, ...) over seeds of the task's best grid point, the grid
    point chosen by its dev median; the values are the reported split's (`reported_split_tag`): the test
    split's where the task has one, else dev's. `dev_<stat>` beside it is always dev's."""
    return f"best/{task}/{stat}"


SEED_STAT = "seed_"  # best_task_metric(task, f"seed_{seed}"): one seed's score at the task's best grid point


def seed_scores(metrics: dict[str, float], task: str) -> dict[int, float]:
    """On a sweep parent: {seed: score} at the task's best grid point, read from its per-seed metrics: the
    values the claims' tests over seeds rest on (analysis/claims.py)."""
    prefix = best_task_metric(task, SEED_STAT)
    return {int(key.removeprefix(prefix)): value for key, value in metrics.items()
            if key.startswith(prefix) and key.removeprefix(prefix).isdigit()}


DEV_STAT = "dev_"  # best_task_metric(task, f"dev_{stat}") and f"dev_seed_{seed}": the dev split's value at the
#                   best grid point, beside the reported one: what chose the point, never the number reported


def dev_seed_scores(metrics: dict[str, float], task: str) -> dict[int, float]:
    """On a sweep parent: {seed: dev score} at the task's best grid point (the selection split's values)."""
    prefix = best_task_metric(task, DEV_STAT + SEED_STAT)
    return {int(key.removeprefix(prefix)): value for key, value in metrics.items()
            if key.startswith(prefix) and key.removeprefix(prefix).isdigit()}


def reported_split_tag(task: str) -> str:
    """On a sweep parent: which split the task's reported values (`best/<task>/<stat>`, `seed_<n>`) come
    from: "test" where the task has a test split (SNLI, a user folder's test file), else "dev"."""
    return f"reported.{task}"


def fewshot_metric(task: str, method: str, stat: str) -> str:
    """On a few-shot study's parent: `stat` (mean, std, or seed_<split>: one split's test accuracy) of a
    task and method (prompt or head) at its chosen learning rate."""
    return f"fewshot/{task}/{method}/{stat}"


def fraction_target(target: str, fraction: float) -> str:
    """A task (or target) trained on `fraction` of its training labels, as it is named in sweep tables and
    metric keys: 'SNLI:0.1' (MLflow allows no '@' in a metric key). All the labels keep the plain name."""
    return target if fraction >= 1 else f"{target}:{fraction:g}"


def split_fraction(target: str) -> tuple[str, float]:
    """`fraction_target`'s inverse: ('SNLI', 0.1) for 'SNLI:0.1', ('SNLI', 1.0) for 'SNLI'."""
    name, _, fraction = target.rpartition(":")
    try:
        return (name, float(fraction)) if name else (target, 1.0)
    except ValueError:
        return target, 1.0


def best_point_tag(task: str) -> str:
    """On a sweep parent: the key of the task's best grid point (lr, batch size, epochs, warm-up)."""
    return f"best.{task}"


def best_task(key: str) -> str | None:
    """The task of a `best_task_metric(task, "median")` key (the sweep's headline score), else None."""
    head, tail = best_task_metric("\0", "median").split("\0")
    task = key.removeprefix(head).removesuffix(tail)
    return task if task and key == head + task + tail else None


# Pretraining metrics that mean the same thing in every variant that logs them, first in every study
# view. `loss` is not among them: each variant sums different terms with different weights (rtd_only
# 26.2 against cocolm 39.0 at the same step says nothing about which learned more).
COMPARABLE_METRICS = (
    "aux_mlm_accuracy", "copy_accuracy_replaced", "copy_accuracy_original", "lm_accuracy_replaced",
    "lm_accuracy_original", "mlm_accuracy", "scl_positive_cosine", "scl_negative_cosine",
    "cls_positive_cosine", "cls_negative_cosine",
    "aux_mlm_loss", "copy_loss", "lm_loss", "scl_loss", "mlm_loss",
    *REPRESENT_METRICS, *PROBE_METRICS,
)
NOT_COMPARABLE = ("loss",)  # shown last, and said to be a different sum per variant
