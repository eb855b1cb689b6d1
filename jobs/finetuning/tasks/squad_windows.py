"""SQuAD 2.0 questions into model windows, and windows' start/end logits back into answers
(docs/method.md section 7.6).

**Windows.** A question (at most `max_question_length` tokens) and a window of its context go in as
`[CLS] question [SEP] [SEP] context window [SEP]`, the pair format of either tokenizer scheme (the
authors' too, with their special ids: `jobs.data.tokens.Scheme`), at most `max_length` tokens. A
context longer than one window is covered by several, each starting `doc_stride` tokens after the
previous one (BERT's document stride: windows overlap by `window - doc_stride` tokens). The answer's
character span becomes token positions through the tokenizer's character offsets
(`Scheme.ids_and_offsets`: the authors' tokenizer traces them back through its pre-tokenizer); an
unanswerable question, or a window that does not hold the whole answer, points start and end at [CLS]
(position 0).

**Answers.** Per question, over all its windows: the `n_best` highest start and end logits of the
context tokens give candidate spans (end not before start, at most `max_answer_length` tokens); the
best candidate scores start + end logit. The no-answer score is start + end logit at [CLS], the
lowest over the question's windows (the window most sure there is an answer), as in BERT. The
question is answered with the best span's text unless the no-answer score beats it;
`na_prob = sigmoid(no-answer score - best span score)`, which the official evaluation also uses to
find the best threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jobs.cli import UserError
from jobs.data.tokens import Scheme
from jobs.finetuning.tasks.squad import Question, Questions
from jobs.finetuning.tasks.squad_eval import gold_texts

N_BEST = 20
MAX_ANSWER_LENGTH = 30  # tokens


@dataclass(frozen=True)
class SpanIndex:
    """What turns a window's logits back into answer text: for window w, its context tokens are the
    question's context tokens [token_start[w], token_start[w] + length[w]), at positions first[w]..."""

    question: np.ndarray  # (N,) index into `ids` of the question the window belongs to
    first: np.ndarray  # (N,) position in the window of its first context token
    token_start: np.ndarray  # (N,)
    length: np.ndarray  # (N,) context tokens in the window
    char_offsets: list[np.ndarray]  # per question: (context tokens, 2) character span of each token
    contexts: list[str]  # per question (shared strings)
    ids: list[str]  # per question: its SQuAD id
    gold: dict[str, list[str]]  # per question id: the gold answer texts, [""] when unanswerable


def windows(context_tokens: int, budget: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `context_tokens` tokens, `budget` tokens per window at most."""
    spans, start = [], 0
    while True:
        length = min(budget, context_tokens - start)
        spans.append((start, length))
        if start + length >= context_tokens:
            return spans
        start += min(length, doc_stride)


def answer_tokens(offsets: np.ndarray, char_start: int, char_end: int) -> tuple[int, int]:
    """The first and last context token that overlap the answer's characters [char_start, char_end).
    A token's offsets may include the space before its word ('▁word'); overlap handles that."""
    overlap = np.nonzero((offsets[:, 1] > char_start) & (offsets[:, 0] < char_end))[0]
    if not len(overlap):  # the answer lies in characters no token covers (only spaces): nothing to learn
        return -1, -1
    return int(overlap[0]), int(overlap[-1])


def encode_questions(scheme: Scheme, questions: Questions, max_length: int, doc_stride: int,
                     max_question_length: int):
    """Windows of every question: ids (ragged), labels (N, 2) start/end positions, the SpanIndex,
    and how many questions were cut to `max_question_length` tokens."""
    if max_length - max_question_length - 4 < 1:
        raise UserError(f"SQuAD windows of {max_length} tokens leave no room for context after a question of "
                         f"up to {max_question_length} tokens: raise max_length or lower max_question_length")
    contexts = _encode_contexts(scheme, questions.items)
    asked = scheme.batch_ids([q.question for q in questions.items])
    cls, sep = scheme.cls_id, scheme.sep_id
    sequences, labels, rows, cut = [], [], [], 0
    for i, (q, a) in enumerate(zip(questions.items, asked)):
        q_ids = a[:max_question_length]
        cut += len(a) > max_question_length
        ctx_ids, offsets = contexts[q.context]
        answer = answer_tokens(offsets, *q.span()) if q.answerable else (-1, -1)
        first = len(q_ids) + 3  # [CLS] question [SEP] [SEP]
        for start, length in windows(len(ctx_ids), max_length - len(q_ids) - 4, doc_stride):
            sequences.append([cls, *q_ids, sep, sep, *ctx_ids[start : start + length], sep])
            inside = answer[0] >= start and 0 <= answer[1] < start + length
            labels.append((answer[0] - start + first, answer[1] - start + first) if inside else (0, 0))
            rows.append((i, first, start, length))
    index = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
    spans = SpanIndex(index[:, 0], index[:, 1], index[:, 2], index[:, 3],
                      [contexts[q.context][1] for q in questions.items], [q.context for q in questions.items],
                      [q.id for q in questions.items], {q.id: gold_texts(t for t, _ in q.answers) for q in questions.items})
    return sequences, np.asarray(labels, dtype=np.int64).reshape(-1, 2), spans, cut


def _encode_contexts(scheme: Scheme, items: list[Question]) -> dict[str, tuple[list[int], np.ndarray]]:
    """Each distinct paragraph tokenized once: its ids and each token's character offsets."""
    unique = list(dict.fromkeys(q.context for q in items))
    encoded = scheme.batch_ids_and_offsets(unique)
    return {c: (ids, np.asarray(offsets, dtype=np.int64).reshape(-1, 2)) for c, (ids, offsets) in zip(unique, encoded)}


# ----------------------------------------------------------------------------- logits -> answers


def best_answers(spans: SpanIndex, start_logits: list[np.ndarray], end_logits: list[np.ndarray],
                 n_best: int = N_BEST, max_answer_length: int = MAX_ANSWER_LENGTH
                 ) -> tuple[dict[str, str], dict[str, float]]:
    """Per question id: the predicted text ("" = no answer) and the no-answer probability."""
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for w, q in enumerate(spans.question.tolist()):
        s, e = start_logits[w], end_logits[w]
        null[q] = min(null.get(q, math.inf), float(s[0] + e[0]))
        candidate = _best_span(spans, w, s, e, n_best, max_answer_length)
        if candidate is not None and (q not in best or candidate[0] > best[q][0]):
            best[q] = candidate
    predictions, na_probs = {}, {}
    for q, qid in enumerate(spans.ids):
        score, text = best.get(q, (-math.inf, ""))
        diff = null.get(q, math.inf) - score  # > 0: no answer is more likely than the best span
        predictions[qid] = "" if diff > 0 else text
        na_probs[qid] = 1.0 / (1.0 + math.exp(-diff)) if diff < 700 else 1.0  # sigmoid without overflow
    return predictions, na_probs


def _best_span(spans: SpanIndex, w: int, s: np.ndarray, e: np.ndarray, n_best: int,
               max_answer_length: int) -> tuple[float, str] | None:
    """The best (start + end logit, text) among one window's n-best starts and ends, or None."""
    first, length = int(spans.first[w]), int(spans.length[w])
    s, e = s[first : first + length], e[first : first + length]
    starts = np.argsort(-s, kind="stable")[:n_best]
    ends = np.argsort(-e, kind="stable")[:n_best]
    found = None
    for i in starts.tolist():
        for j in ends.tolist():
            if i <= j < i + max_answer_length and (found is None or s[i] + e[j] > found[0]):
                found = (float(s[i] + e[j]), i, j)
    if found is None:
        return None
    q, offset = int(spans.question[w]), int(spans.token_start[w])
    chars = spans.char_offsets[q]
    return found[0], spans.contexts[q][chars[offset + found[1], 0] : chars[offset + found[2], 1]].strip()
