"""The gate: a pretraining run counts as evidence only if it trained.

A study's claims compare variants; a run whose heads never left their priors (an auxiliary at the
unigram plateau, a copy head that calls every token original, every sentence's [CLS] pointing the
same way) says nothing about its objective, only that the recipe failed for it. Each criterion reads
the run's own logged metrics and is declared once here, with its reason. `jobs.studies.ablate` tags
every run with the result (GATE_TAG) and `analysis.claims` reads the same rules, so a report of runs
made elsewhere is gated alike. No torch here.

The accuracies are the last logged interval's means on training batches, measured before each
batch's update; a CPU study trains for about one epoch of the shipped corpus, so nearly every block
is unseen when it is scored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jobs.names import RANDOM_INIT_VARIANT, REPRESENT_METRICS

TRAINED = "trained"
CONTROL = "control"  # the random-init encoder: a reference, never gated
FINISHED = "FINISHED"
UNFINISHED = ("RUNNING", "SCHEDULED", "KILLED")  # MLflow statuses of a run that has not ended (KILLED: stopped, resumable)
NOT_FINISHED = "not finished"  # such a run's only verdict: its partial metrics say nothing about the recipe


@dataclass(frozen=True)
class Criterion:
    name: str
    metric: str  # a metric key of the pretraining run
    bound: float
    above: bool  # passes when the metric is at least `bound` (else: at most)
    reason: str
    needs_param: str = ""  # applies only when this config param is true (the variant trains the head)

    def applies(self, metrics: Mapping[str, float], params: Mapping[str, str]) -> bool:
        wanted = not self.needs_param or str(params.get(self.needs_param, "")).lower() == "true"
        return wanted and self.metric in metrics

    def passes(self, value: float) -> bool:
        return value >= self.bound if self.above else value <= self.bound

    def text(self) -> str:
        return f"{self.metric} {'>=' if self.above else '<='} {self.bound:g}"


# Unigram plateau: predicting the most frequent pieces gives 0.040 at the [MASK] inputs on the shipped
# corpus (docs/design.md section 5.4); twice that is language modelling, not frequency.
PLATEAU_BOUND = 0.08
CRITERIA = (
    Criterion("auxiliary left the unigram plateau", "aux_mlm_accuracy", PLATEAU_BOUND, True,
              "an auxiliary at the plateau samples frequent pieces, which the main encoder can only learn to spot "
              "by frequency; twice the plateau's 0.040 is language modelling"),
    Criterion("MLM left the unigram plateau", "mlm_accuracy", PLATEAU_BOUND, True,
              "roberta_mlm's only signal: at the plateau it predicts frequency, not text"),
    Criterion("replaced tokens found", "copy_accuracy_replaced", 0.05, True,
              "a copy (RTD) head below 5% on replaced tokens calls nearly every token original, the loss's "
              "base rate: the main encoder learned nothing it could use", needs_param="objective.use_copy_loss"),
    Criterion("[CLS] not collapsed", REPRESENT_METRICS[0], 0.99, False,
              "random sentence pairs at a mean [CLS] cosine above 0.99 point within 8 degrees of one direction: "
              "the representation every downstream readout starts from has collapsed"),
)

GATE_PARAMS = tuple(c.needs_param for c in CRITERIA if c.needs_param)  # the run params the gate reads


@dataclass(frozen=True)
class GateResult:
    verdict: str  # TRAINED, CONTROL, or "failed: <each failed criterion with the run's value>"
    failed: tuple[str, ...] = ()  # the failed criteria's names (or "run failed", "stopped", NOT_FINISHED)
    checked: tuple[str, ...] = ()  # the criteria that applied

    @property
    def counts(self) -> bool:
        """Whether the run counts in a study: trained, or the control."""
        return self.verdict in (TRAINED, CONTROL)


def gate(variant: str, status: str, stopped: str, metrics: Mapping[str, float],
         params: Mapping[str, str]) -> GateResult:
    """Whether a pretraining run trained, from its status, stop reason, metrics and params."""
    if variant == RANDOM_INIT_VARIANT:
        return GateResult(CONTROL)
    if status in UNFINISHED:  # mid-run metrics would fail criteria the finished run may well pass
        return GateResult(f"{NOT_FINISHED} (run {status.lower()})", (NOT_FINISHED,))
    failed: list[tuple[str, str]] = []
    if status != FINISHED:
        failed.append((f"run {status.lower()}", f"run {status.lower()}"))
    if stopped:
        failed.append(("stopped", f"stopped: {stopped}"))
    checked = [c for c in CRITERIA if c.applies(metrics, params)]
    failed += [(c.name, f"{c.name} ({c.metric} {metrics[c.metric]:.3f}, needs {c.text().split(' ', 1)[1]})")
               for c in checked if not c.passes(metrics[c.metric])]
    verdict = TRAINED if not failed else "failed: " + "; ".join(detail for _, detail in failed)
    return GateResult(verdict, tuple(name for name, _ in failed), tuple(c.name for c in checked))
