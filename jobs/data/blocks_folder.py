"""Packed blocks saved to a folder, for work that trains without Ray (`jobs.studies.curves`).

    FOLDER/blocks.npy       (N, seq_len) int32, the stream's packed blocks ([CLS] + tokens, [PAD] at the end)
    FOLDER/blocks.json      seq_len, vocab_size, blocks, tokens (non-[PAD]), the corpus
    FOLDER/tokenizer.json   the tokenizer that made them

Written by `python -m jobs.data.pack` (the job's Ray Data stream); read here with numpy alone, so the
folder can be copied to a GPU machine that has torch but not Ray.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from model.config import SpecialTokens

from jobs.cli import UserError

BLOCKS_FILE, META_FILE, TOKENIZER_FILE = "blocks.npy", "blocks.json", "tokenizer.json"
PACKED_FILES = (BLOCKS_FILE, META_FILE, TOKENIZER_FILE)


def save_blocks(blocks: np.ndarray, tokenizer_dir: Path, vocab_size: int, corpus: list[str] | str, folder: Path) -> dict:
    """Write the folder; its description (the blocks.json content). The three files are written to a
    staging folder beside it, which then takes its place by rename: a crash leaves the old folder
    whole (or none), never new blocks beside an old blocks.json."""
    check_out_folder(folder)
    folder = folder.resolve()
    staging = folder.with_name(f".{folder.name}.packing-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)  # one this process left before
    staging.mkdir(parents=True)
    try:
        np.save(staging / BLOCKS_FILE, blocks.astype(np.int32))
        shutil.copy(tokenizer_dir / TOKENIZER_FILE, staging / TOKENIZER_FILE)
        meta = {"seq_len": int(blocks.shape[1]), "vocab_size": vocab_size, "blocks": int(len(blocks)),
                "tokens": int((blocks != SpecialTokens().pad).sum()), "corpus": corpus}
        (staging / META_FILE).write_text(json.dumps(meta, indent=1))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = folder.with_name(f".{folder.name}.replaced-{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return meta


def check_out_folder(folder: Path) -> None:
    """The folder to pack into is new, empty or an earlier packing (replaced whole): a folder that holds
    anything else (`--out .`) is an error that names it, before any work."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--out {folder} is a file: give a folder for the packed blocks")
    others = sorted(p.name for p in folder.iterdir() if p.name not in PACKED_FILES) if folder.is_dir() else []
    if others:
        raise UserError(f"--out {folder} holds other files ({', '.join(others[:5])}"
                        f"{', ...' if len(others) > 5 else ''}): packing replaces the folder whole, so give a new "
                        f"or empty one")


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
