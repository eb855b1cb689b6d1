"""Representation analysis (paper Fig. 1/5): cosine similarity of [CLS] vectors, random vs similar pairs.

    python -m jobs.studies.represent --from RUN_ID[,RUN_ID...] | --from-experiment NAME
        [--pairs 500] [--max-length 64] [--tracking-uri URI] [--out DIR]

For each pretraining run: its exported encoder (artifact `encoder/`, with the tokenizer) embeds
`--pairs` random pairs of documents of the shipped corpus (data/corpus, each cut to `--max-length`
tokens) and as many semantically similar pairs (SNLI entailment premise/hypothesis pairs from the
shipped SNLI train split), each text alone as `[CLS] text [SEP]`; the [CLS] vector of the last
layer is the sentence's representation. The pairs are drawn with a fixed seed, so every run sees
the same pairs. Logged on the pretraining run itself: metrics represent/random_cosine_mean,
represent/similar_cosine_mean, represent/cosine_gap (similar - random), the per-pair cosines
`represent/cosines.csv` and its histogram `represent/fig1_cls_cosine.png`. With --from-experiment every
pretraining run of that experiment is analysed (the newest per variant); --out writes one figure
with the variants side by side (`analysis.report` draws the same figure from the logged files).

COCO-LM spreads random pairs around 0 and keeps similar pairs high; ELECTRA-style objectives pile
every pair near 0.9 (the paper's anisotropy argument).
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from mlflow.tracking import MlflowClient

from model import Encoder
from model.classifier import load_encoder

from jobs import tracking
from jobs.cli import AT_LEAST_ONE, Range, UserError, comma_list, option, parse_options, run_main
from jobs.data.corpus import parse_file, shipped_corpus
from jobs.data.schemes import load_scheme
from jobs.env import set_hermetic_env
from jobs.finetuning.encoding import batches, encode_split
from jobs.finetuning.tasks.snli import read_snli
from jobs.finetuning.tasks.specs import SNLI
from jobs.finetuning.tasks.task import Split
from jobs.names import REPRESENT_ARTIFACT, REPRESENT_METRICS
from jobs.run_tables import finished_run_ids
from jobs.studies.figures import representation_figure

SEED = 0
MAX_LENGTH = 64  # tokens per text, [CLS] and [SEP] included


@dataclass(frozen=True)
class Pairs:
    random: list[tuple[str, str]]  # two different corpus documents
    similar: list[tuple[str, str]]  # SNLI premise and its entailed hypothesis


def corpus_documents() -> list[str]:
    """The shipped corpus' cleaned documents (the same cleaning as pretraining's)."""
    documents = []
    for path in shipped_corpus():
        documents += parse_file(path, Path(path).read_bytes())[0]
    return documents


def draw_pairs(count: int, documents: list[str] | None = None, seed: int = SEED) -> Pairs:
    """`count` random corpus pairs and `count` SNLI entailment pairs, the same for every run."""
    documents = documents if documents is not None else corpus_documents()
    rng = random.Random(seed)
    random_pairs = [tuple(rng.sample(documents, 2)) for _ in range(count)]
    train = read_snli().train
    entailment = SNLI.labels.index("entailment")
    similar = [(a, b) for a, b, label in zip(train.text, train.text_pair, train.labels) if label == entailment]
    return Pairs(random_pairs, rng.sample(similar, min(count, len(similar))))


def cls_vectors(encoder: Encoder, tokenizer_dir: Path, texts: list[str], max_length: int,
                batch_size: int = 64) -> torch.Tensor:
    """The last layer's [CLS] vector of each text encoded alone: (N, H) float tensor, in the tokenizer
    scheme `tokenizer_dir` holds (an encoder converted from the authors' checkpoint reads their ids)."""
    # The fine-tuning format and batching ([CLS] text [SEP], cut to max_length): one way to tokenize and pad.
    scheme = load_scheme(tokenizer_dir)
    unlabelled = Split(list(texts), None, [0] * len(texts), "represent")
    split, _ = encode_split(scheme, unlabelled, max_length)
    pad = scheme.pad_id
    encoder.eval()
    with torch.no_grad():
        vectors = [encoder(ids, ids != pad)[:, 0]  # (B, H)
                   for ids, _ in batches(split, np.arange(len(split)), batch_size, pad)]
    return torch.cat(vectors)


def pair_cosines(encoder_dir: Path, pairs: Pairs, max_length: int = MAX_LENGTH) -> pd.DataFrame:
    """One row per pair: kind (random | similar) and the cosine of the two [CLS] vectors."""
    torch.manual_seed(SEED)
    encoder = load_encoder(encoder_dir)
    frames = []
    for kind, chosen in (("random", pairs.random), ("similar", pairs.similar)):
        if not chosen:
            continue
        left = cls_vectors(encoder, encoder_dir, [a for a, _ in chosen], max_length)
        right = cls_vectors(encoder, encoder_dir, [b for _, b in chosen], max_length)
        cosine = torch.nn.functional.cosine_similarity(left, right, dim=-1)  # (N,)
        frames.append(pd.DataFrame({"kind": kind, "cosine": cosine.numpy().astype(float)}))
    return pd.concat(frames, ignore_index=True)


def summary(cosines: pd.DataFrame) -> dict[str, float]:
    random_mean = float(cosines.loc[cosines["kind"] == "random", "cosine"].mean())
    similar_mean = float(cosines.loc[cosines["kind"] == "similar", "cosine"].mean())
    return dict(zip(REPRESENT_METRICS, (random_mean, similar_mean, similar_mean - random_mean)))


def analyse_run(client: MlflowClient, run_id: str, pairs: Pairs, max_length: int) -> tuple[str, pd.DataFrame]:
    """Download the run's encoder, compute the cosines, log metrics, CSV and figure on the run."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per encoder file otherwise
    run = client.get_run(run_id)
    label = f"{run.data.tags.get('variant', run.info.run_name)} ({run.data.tags.get('preset', '?')})"
    with tempfile.TemporaryDirectory(prefix="cocolm-represent-") as tmp:
        encoder_dir = Path(client.download_artifacts(run_id, "encoder", tmp))
        cosines = pair_cosines(encoder_dir, pairs, max_length)
        values = summary(cosines)
        for key, value in values.items():
            client.log_metric(run_id, key, value)
        client.log_text(run_id, cosines.to_csv(index=False), REPRESENT_ARTIFACT)
        figure = representation_figure({label: cosines}, Path(tmp) / "fig1_cls_cosine.png")
        client.log_artifact(run_id, str(figure), "represent")
    random_mean, similar_mean, gap = (values[k] for k in REPRESENT_METRICS)
    print(f"{label} run {run_id}: mean cosine random {random_mean:.3f}, similar {similar_mean:.3f}, gap {gap:.3f}; "
          f"logged as its metrics {', '.join(REPRESENT_METRICS)} and artifacts {REPRESENT_ARTIFACT}, "
          f"represent/fig1_cls_cosine.png", flush=True)
    return label, cosines


@dataclass(frozen=True)
class RepresentOptions:
    runs: tuple[str, ...] = field(default=(), metadata=option(
        "pretraining MLflow run id(s), comma separated", flag="--from", parse=comma_list))
    experiment: str | None = field(default=None, metadata=option(
        "the runs to analyse: every variant's newest finished pretraining run of this MLflow experiment",
        flag="--from-experiment"))
    pairs: int = field(default=500, metadata=option("random pairs and similar pairs, each", bounds=AT_LEAST_ONE))
    max_length: int = field(default=MAX_LENGTH, metadata=option("tokens per text, [CLS] and [SEP] included", bounds=Range(3)))
    tracking_uri: str | None = field(default=None, metadata=option(
        "MLflow tracking URI (default: sqlite store under $COCOLM_HOME)"))
    out: str | None = field(default=None, metadata=option("also write the side-by-side figure here"))

    def __post_init__(self) -> None:
        if bool(self.runs) == bool(self.experiment):
            raise UserError("give the runs to analyse: --from RUN_ID[,RUN_ID...] or --from-experiment NAME (one of them)")


def run(opts: RepresentOptions) -> dict[str, pd.DataFrame]:
    """Analyse the given runs (or the newest run per variant of the experiment); returns label -> cosines."""
    set_hermetic_env()
    tracking_uri = opts.tracking_uri or tracking.default_tracking_uri()
    tracking.check_sqlite(tracking_uri)  # a store that only is read: never made here
    client = MlflowClient(tracking_uri)
    run_ids = list(opts.runs) or finished_run_ids(client, opts.experiment, tracking_uri, newest_per_seed=True)
    chosen = draw_pairs(opts.pairs)
    results = dict(analyse_run(client, run_id, chosen, opts.max_length) for run_id in run_ids)
    if opts.out:
        Path(opts.out).mkdir(parents=True, exist_ok=True)
        print(f"wrote {representation_figure(results, Path(opts.out) / 'fig1_cls_cosine.png')}")
    first = client.get_run(run_ids[0]).info.experiment_id  # where to look: the runs, in the MLflow UI
    print(tracking.ui_links(tracking_uri, first, run_id=run_ids[0] if len(run_ids) == 1 else None,
                            compare=run_ids if len(run_ids) > 1 else []), flush=True)
    return results


def main(argv: list[str] | None = None) -> dict[str, pd.DataFrame]:
    return run(parse_options("python -m jobs.studies.represent", __doc__, RepresentOptions, argv))

if __name__ == "__main__":
    run_main(main)
