"""Documents into packed blocks: the stream's Ray Data UDF (jobs.data.stream).

Every Ray Data worker of a run imports this module to run the UDF, and the scheme it is given (pickled,
`jobs.data.tokens`): so both import numpy and the tokenizer alone, never torch or Ray Train (3.1 s per
worker for jobs.data.stream, which the consumer side needs; a 2-step run had 4 such workers besides the
Train worker).
"""

from __future__ import annotations

import numpy as np

from model.config import SpecialTokens


def pack(documents: list[list[int]], seq_len: int, special: SpecialTokens = SpecialTokens()) -> np.ndarray:
    """Pack token lists into (N, seq_len) int32 blocks: [CLS] + seq_len - 1 tokens of doc [SEP] doc [SEP] ..."""
    body = seq_len - 1
    lengths = [len(d) + 1 for d in documents]  # + [SEP]
    stream = np.full(sum(lengths), special.sep, dtype=np.int32)
    ends = np.cumsum(lengths)
    for doc, end, length in zip(documents, ends, lengths):
        stream[end - length : end - 1] = doc
    n_blocks = -(-len(stream) // body)
    padded = np.full(n_blocks * body, special.pad, dtype=np.int32)
    padded[: len(stream)] = stream
    cls = np.full((n_blocks, 1), special.cls, dtype=np.int32)
    return np.concatenate([cls, padded.reshape(n_blocks, body)], axis=1)  # (N, T)


def tokenize_and_pack(batch: dict[str, np.ndarray], scheme, seq_len: int) -> dict[str, np.ndarray]:
    """Ray Data UDF: documents -> packed blocks, with the scheme's ids and its [CLS], [SEP] and [PAD]."""
    return {"input_ids": pack(scheme.batch_ids(list(batch["text"])), seq_len, scheme.special_tokens)}
