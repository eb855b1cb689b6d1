"""jobs.finetuning.encoding: [CLS] A [SEP] [SEP] B [SEP], longest side cut first."""

from __future__ import annotations

from jobs.finetuning.encoding import encode_task
from jobs.finetuning.tasks.glue import read_glue_task
from test_readers import write_glue


def test_pairs_encode_as_cls_a_sep_sep_b_sep_and_truncate(tmp_path, tokenizer_dir):
    from tokenizers import Tokenizer

    write_glue(tmp_path, n=4)
    task = read_glue_task("rte", tmp_path)
    encoded = encode_task(task, tokenizer_dir, max_length=64)
    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    cls, sep = vocab.token_to_id("[CLS]"), vocab.token_to_id("[SEP]")
    first = encoded.train.ids[encoded.train.offsets[0]:encoded.train.offsets[1]].tolist()
    a = vocab.encode("Text 0.", add_special_tokens=False).ids
    b = vocab.encode("Hypothesis 0.", add_special_tokens=False).ids
    assert first == [cls, *a, sep, sep, *b, sep]
    assert encoded.train.labels.tolist() == [0, 1, 0, 1]
    short = encode_task(task, tokenizer_dir, max_length=8)
    assert short.train.lengths().max() <= 8 and short.truncated["train"] > 0
    single = encode_task(read_glue_task("sst-2", tmp_path), tokenizer_dir, max_length=64)
    one = single.dev["dev"].ids[single.dev["dev"].offsets[0]:single.dev["dev"].offsets[1]].tolist()
    assert one[0] == cls and one[-1] == sep and sep not in one[1:-1]
