"""Packed blocks saved to a folder, for work that trains without Ray (`jobs.studies.curves`).

    FOLDER/blocks.npy       (N, seq_len) int32, the stream's packed blocks ([CLS] + tokens, [PAD] at the end)
    FOLDER/blocks.json      seq_len, vocab_size, blocks, tokens (non-[PAD]), the corpus
    FOLDER/tokenizer.json   the tokenizer that made them

Written by `python -m jobs.data.pack` (the job's Ray Data stream); read here with numpy alone, so the
folder can be copied to a GPU machine that has torch but not Ray.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from model.corruption import SpecialTokens

from jobs.cli import UserError

BLOCKS_FILE, META_FILE, TOKENIZER_FILE = "blocks.npy", "blocks.json", "tokenizer.json"


def save_blocks(blocks: np.ndarray, tokenizer_dir: Path, vocab_size: int, corpus: list[str] | str, folder: Path) -> dict:
    """Write the folder; its description (the blocks.json content)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / BLOCKS_FILE, blocks.astype(np.int32))
    shutil.copy(tokenizer_dir / TOKENIZER_FILE, folder / TOKENIZER_FILE)
    meta = {"seq_len": int(blocks.shape[1]), "vocab_size": vocab_size, "blocks": int(len(blocks)),
            "tokens": int((blocks != SpecialTokens().pad).sum()), "corpus": corpus}
    (folder / META_FILE).write_text(json.dumps(meta, indent=1))
    return meta


def load_blocks(folder: Path, seq_len: int) -> tuple[np.ndarray, dict]:
    """The blocks and their description; a folder without them, or with blocks of another length, is an
    error that says how to make the right ones."""
    if not (folder / BLOCKS_FILE).is_file():
        raise UserError(f"no packed blocks in {folder}: pack them first with "
                                f"`python -m jobs.data.pack --seq-len {seq_len} --vocab-size V --out {folder}`")
    meta = json.loads((folder / META_FILE).read_text())
    if meta["seq_len"] != seq_len:
        raise UserError(f"{folder} holds blocks of {meta['seq_len']} tokens and this run wants data.seq_len="
                         f"{seq_len}: pack another folder with `python -m jobs.data.pack --seq-len {seq_len}`")
    return np.load(folder / BLOCKS_FILE), meta
