"""jobs.gate: a run counts only if it trained; each criterion on its own."""

import pytest

from jobs.names import RANDOM_INIT_VARIANT, REPRESENT_METRICS
from jobs.gate import CONTROL, CRITERIA, NOT_FINISHED, PLATEAU_BOUND, TRAINED, UNFINISHED, gate

COPY = {"objective.use_copy_loss": "True"}
GOOD = {"aux_mlm_accuracy": 0.12, "copy_accuracy_replaced": 0.14, REPRESENT_METRICS[0]: 0.87}


def test_a_run_that_learned_everything_it_trains_is_trained():
    result = gate("cocolm", "FINISHED", "", GOOD, COPY)
    assert result.verdict == TRAINED and result.counts
    assert set(result.checked) == {"auxiliary left the unigram plateau", "replaced tokens found", "[CLS] not collapsed"}


@pytest.mark.parametrize("metric, value, name", [
    ("aux_mlm_accuracy", 0.045, "auxiliary left the unigram plateau"),  # the study's electra-like plateau
    ("copy_accuracy_replaced", 0.0, "replaced tokens found"),  # electra's discriminator in the first CPU study
    (REPRESENT_METRICS[0], 1.0, "[CLS] not collapsed"),  # its random-pair cosine
])
def test_each_criterion_fails_a_run_that_did_not_learn_and_says_which(metric, value, name):
    result = gate("electra", "FINISHED", "", {**GOOD, metric: value}, COPY)
    assert not result.counts and result.failed == (name,)
    assert result.verdict.startswith(f"failed: {name} ({metric} {value:.3f}, needs ")


def test_roberta_mlm_is_gated_on_its_own_mlm_accuracy():
    assert gate("roberta_mlm", "FINISHED", "", {"mlm_accuracy": 0.045}, {}).failed == ("MLM left the unigram plateau",)
    assert gate("roberta_mlm", "FINISHED", "", {"mlm_accuracy": PLATEAU_BOUND}, {}).counts


def test_the_copy_criterion_applies_only_where_the_variant_trains_the_copy_loss():
    """all_token_lm logs copy accuracy through its mixture but trains no copy loss: not a failure of its recipe."""
    no_copy = {"objective.use_copy_loss": "False"}
    assert gate("all_token_lm", "FINISHED", "", {**GOOD, "copy_accuracy_replaced": 0.0}, no_copy).counts


def test_unfinished_or_stopped_runs_do_not_count_and_the_control_is_never_gated():
    assert gate("cocolm", "FAILED", "", GOOD, COPY).failed == ("run failed",)
    assert gate("cocolm", "FINISHED", "non-finite loss at step 12", GOOD, COPY).failed == ("stopped",)
    control = gate(RANDOM_INIT_VARIANT, "FINISHED", "", {REPRESENT_METRICS[0]: 1.0}, COPY)
    assert control.verdict == CONTROL and control.counts


@pytest.mark.parametrize("status", UNFINISHED)
def test_a_run_not_finished_is_only_not_finished_whatever_its_partial_metrics(status):
    """Mid-run, electra's discriminator may not have found a replaced token yet: that is no failed criterion."""
    result = gate("electra", status, "", {**GOOD, "copy_accuracy_replaced": 0.0, "aux_mlm_accuracy": 0.04}, COPY)
    assert not result.counts and result.failed == (NOT_FINISHED,)
    assert result.verdict == f"{NOT_FINISHED} (run {status.lower()})"


def test_every_criterion_declares_its_reason():
    assert all(c.reason and c.bound > 0 for c in CRITERIA)
