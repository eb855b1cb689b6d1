"""What the model reads for a text (pair), under the tokenizer scheme a directory holds (`jobs.data.schemes`):

    python -m jobs.data.tokens DIR --text T [--pair P] [--max-length N]

The last line is the ids as one JSON list; the line before names the scheme and its special ids."""

from __future__ import annotations

import argparse
import json

from jobs.cli import UserError, run_main
from jobs.data.schemes import load_scheme


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.data.tokens", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", metavar="DIR", help="a tokenizer or encoder directory")
    parser.add_argument("--text", required=True, help="the (first) text")
    parser.add_argument("--pair", help="the second text of a pair")
    parser.add_argument("--max-length", type=int, default=512, help="at most this many ids (default 512)")
    args = parser.parse_args(argv)
    if args.max_length < 8:
        raise UserError(f"--max-length must be at least 8, not {args.max_length}")
    scheme = load_scheme(args.directory)
    print(f"{scheme.name} scheme: [CLS]={scheme.cls_id} [SEP]={scheme.sep_id} [PAD]={scheme.pad_id} "
          f"[UNK]={scheme.unk_id} [MASK]={scheme.mask_id}, {scheme.vocab_size} ids")
    print(json.dumps(scheme.encode(args.text, args.pair, args.max_length)))


if __name__ == "__main__":
    run_main(main)
