"""Task readers (real GLUE TSV formats written here, shipped SNLI, user files), metrics, encoding."""

from __future__ import annotations

import gzip
import json
import sys

import pytest

from jobs.cli import UserError
from jobs.finetuning.tasks import load_tasks
from jobs.finetuning.tasks.glue import read_glue_hub, read_glue_task
from jobs.finetuning.tasks.snli import SNLI_DEV_PAIRS, read_snli
from jobs.finetuning.tasks.specs import GLUE
from jobs.finetuning.tasks.subsets import label_subset, subsample
from jobs.finetuning.tasks.user import read_user_task


# ----------------------------------------------------------------------------- GLUE fixtures in the real formats

MNLI_TRAIN_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                     "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
MNLI_DEV_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                   "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\t"
                   "gold_label")
NLI3 = ("contradiction", "entailment", "neutral")


def _write(path, lines, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")


def write_glue(root, n=12, qqp_malformed=()):
    """Every GLUE task in its real TSV layout; `n` rows per file; QQP rows at `qqp_malformed` (0-based) lose a field."""
    def mnli(header, labels_before_gold, shift=0):
        rows = [header]
        for i in range(n):
            gold = NLI3[(i + shift) % 3]
            rows.append("\t".join([str(i), "1", f"{i}e", "fiction", "( a )", "( b )", "(ROOT a)", "(ROOT b)",
                                   f'He said "premise {i}', f"hypothesis {i}", *([gold] * labels_before_gold), gold]))
        return rows

    _write(root / "MNLI" / "train.tsv", mnli(MNLI_TRAIN_HEADER, 1))
    _write(root / "MNLI" / "dev_matched.tsv", mnli(MNLI_DEV_HEADER, 5))
    _write(root / "MNLI" / "dev_mismatched.tsv", mnli(MNLI_DEV_HEADER, 5, shift=2))
    qqp = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
    for i in range(n):
        fields = [str(i), str(2 * i), str(2 * i + 1), f"How do I {i}?", f"How can I {i}?", str(i % 2)]
        if i in qqp_malformed:
            fields = fields[:4] + fields[5:]  # question2 lost, as in QQP's broken rows
        qqp.append("\t".join(fields))
    for split in ("train", "dev"):
        _write(root / "QQP" / f"{split}.tsv", qqp)
        _write(root / "QNLI" / f"{split}.tsv", ["index\tquestion\tsentence\tlabel"] + [
            f"{i}\tWhat is {i}?\tIt is {i}.\t{('entailment', 'not_entailment')[i % 2]}" for i in range(n)])
        _write(root / "SST-2" / f"{split}.tsv", ["sentence\tlabel"] + [f"a film number {i} \t{i % 2}" for i in range(n)])
        # CoLA: no header; source, label, original label (* when unacceptable), sentence
        _write(root / "CoLA" / f"{split}.tsv", [
            f"gj04\t{i % 2}\t{'' if i % 2 else '*'}\tSentence {i} goes here." for i in range(n)])
        _write(root / "RTE" / f"{split}.tsv", ["index\tsentence1\tsentence2\tlabel"] + [
            f"{i}\tText {i}.\tHypothesis {i}.\t{('entailment', 'not_entailment')[i % 2]}" for i in range(n)])
        _write(root / "MRPC" / f"{split}.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [
            f"{i % 2}\t{i}\t{i + 100}\tFirst {i} .\tSecond {i} ." for i in range(n)], bom=True)
        _write(root / "STS-B" / f"{split}.tsv", [
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"] + [
            f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\tA man {i}.\tA person {i}.\t{i * 0.4:.3f}"
            for i in range(n)])
    return root


def test_every_glue_task_reads_from_the_glue_layout(tmp_path):
    tasks = {t.spec.name: t for t in load_tasks("glue", data_dir=write_glue(tmp_path))}
    assert sorted(tasks) == sorted(GLUE)
    for task in tasks.values():
        assert len(task.train) == 12 and all(len(d) == 12 for d in task.dev.values()) and not task.skipped
    mnli = tasks["mnli"]
    assert list(mnli.dev) == ["dev_matched", "dev_mismatched"]
    assert mnli.spec.target("dev_mismatched") == "MNLI-mm"
    assert mnli.train.text[0] == 'He said "premise 0'  # bare quotes are text, not CSV quoting
    assert mnli.train.labels[:3] == [0, 1, 2] and mnli.dev["dev_mismatched"].labels[0] == 2  # gold_label by header
    assert tasks["sts-b"].train.labels[:3] == pytest.approx([0.0, 0.4, 0.8])
    assert tasks["sts-b"].spec.kind == "regression" and tasks["sts-b"].train.text_pair[1] == "A person 1."
    cola = tasks["cola"]
    assert cola.train.text[0] == "Sentence 0 goes here." and cola.train.labels[:2] == [0, 1] and cola.train.text_pair is None
    assert tasks["mrpc"].train.text[1] == "First 1 ." and tasks["mrpc"].train.labels[1] == 1  # BOM-led header found
    assert tasks["qnli"].train.labels[:2] == [0, 1] and tasks["qqp"].train.text_pair[0] == "How can I 0?"
    assert [t.spec.name for t in load_tasks("rte,MRPC", data_dir=tmp_path)] == ["rte", "mrpc"]


def test_qqp_malformed_rows_are_reported_by_line_number(tmp_path):
    write_glue(tmp_path, n=300, qqp_malformed=(1, 40))  # file lines 3 and 42 (header is line 1)
    task = read_glue_task("qqp", tmp_path)
    assert len(task.train) == 298
    assert [(r.line, r.reason) for r in task.skipped if r.path.endswith("train.tsv")] == [
        (3, "expected 6 tab-separated fields, got 5"), (42, "expected 6 tab-separated fields, got 5")]
    report = task.skip_report()
    assert "QQP: skipped 2 malformed row(s)" in report and "line(s) 3, 42" in report and "dev.tsv" in report


def test_a_file_mostly_malformed_is_an_error_not_a_skip(tmp_path):
    write_glue(tmp_path, n=10, qqp_malformed=(0, 1, 2))
    with pytest.raises(ValueError, match=r"3 of 10 rows are malformed.*\n.*line\(s\) 2, 3, 4"):
        read_glue_task("qqp", tmp_path)


def test_unknown_labels_and_columns_are_named(tmp_path):
    write_glue(tmp_path, n=200)
    path = tmp_path / "RTE" / "train.tsv"
    lines = path.read_text().splitlines()
    lines[6] = lines[6].replace("not_entailment", "maybe")  # row 5, file line 7
    path.write_text("\n".join(lines) + "\n")
    task = read_glue_task("rte", tmp_path)
    assert [(r.line, r.reason) for r in task.skipped] == [(7, "label 'maybe' not in ['entailment', 'not_entailment']")]
    (tmp_path / "SST-2" / "train.tsv").write_text("text\tlabel\nfine\t1\n")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['sentence'\]"):
        read_glue_task("sst-2", tmp_path)
    with pytest.raises(ValueError, match="unknown GLUE task 'wnli'"):
        read_glue_task("wnli", tmp_path)


def test_hub_without_datasets_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed; never touches the network
    with pytest.raises(ImportError, match="pip install datasets.*--data-dir"):
        read_glue_hub("rte")


# ----------------------------------------------------------------------------- SNLI and user-defined tasks


def test_snli_dev_is_held_out_by_premise_with_a_fixed_seed():
    task = read_snli()
    dev = task.dev["dev"]
    assert SNLI_DEV_PAIRS <= len(dev) < SNLI_DEV_PAIRS + 10
    assert len(task.train) + len(dev) == 99_890 and len(task.test) == 9_824
    assert not set(dev.text) & set(task.train.text)  # no premise on both sides
    assert read_snli().dev["dev"].text_pair == dev.text_pair  # the same holdout every time
    small = subsample(task, max_train=500, max_dev=100)
    assert len(small.train) == 500 and len(small.dev["dev"]) == 100 and len(small.test) == 9_824
    assert subsample(task, 500, 100).train.text_pair == small.train.text_pair
    assert any("held out by premise" in n for n in task.notes)


def test_snli_is_read_once_per_process_until_its_files_change(tmp_path):
    """A study reads SNLI for every sweep, probe and readout: the same Task again, read anew once a file of
    the folder changed."""
    rows = [{"premise": f"a man plays {i // 3}", "hypothesis": f"someone acts {i}", "label": ["entailment",
             "neutral", "contradiction"][i % 3]} for i in range(90)]

    def write(name: str, count: int) -> None:
        (tmp_path / f"{name}.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows[:count]).encode()))

    write("train", 60), write("test", 30)
    first = read_snli(tmp_path, dev_pairs=9)
    assert read_snli(tmp_path, dev_pairs=9) is first and len(first.train) + len(first.dev["dev"]) == 60
    assert read_snli(tmp_path, dev_pairs=12) is not first  # another holdout is another read
    write("train", 90)
    again = read_snli(tmp_path, dev_pairs=9)
    assert len(again.train) + len(again.dev["dev"]) == 90 and len(again.test) == 30


def test_user_file_split_kind_inferred_and_malformed_rows_reported(tmp_path):
    rows = [{"text": f"review {i}", "label": ["bad", "good"][i % 2]} for i in range(200)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(10, "{broken json")  # line 11
    path = tmp_path / "reviews.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    task = read_user_task(path)
    assert task.spec.name == "reviews" and task.spec.kind == "classification" and task.spec.labels == ("bad", "good")
    assert len(task.train) + len(task.dev["dev"]) == 200 and len(task.dev["dev"]) == 20
    assert [(r.line, r.reason) for r in task.skipped] == [(11, "not a JSON object")]
    assert read_user_task(path).dev["dev"].text == task.dev["dev"].text  # fixed-seed split
    assert task.spec.score == "accuracy" and "f1" in task.spec.metrics

    csv_path = tmp_path / "similarity.csv"
    csv_path.write_text("text,text_pair,label\n" + "".join(f'"a, {i}",b {i},{i / 7:.3f}\n' for i in range(100)))
    regression = read_user_task(csv_path)
    assert regression.spec.kind == "regression" and regression.spec.score == "spearman"
    assert regression.train.text_pair is not None and "," in regression.train.text[0]
    ratings = tmp_path / "ratings.tsv"
    ratings.write_text("text\tlabel\n" + "".join(f"item {i}\t{1 + i % 5}\n" for i in range(100)))
    assert read_user_task(ratings).spec.labels == ("1", "2", "3", "4", "5")  # whole numbers: classes by default
    overridden = read_user_task(ratings, kind="regression")
    assert overridden.spec.kind == "regression" and set(overridden.train.labels) <= {1.0, 2.0, 3.0, 4.0, 5.0}


def user_file(tmp_path, good: int, bad_lines: list[int]):
    """A jsonl task file of `good` labelled rows with `[1, 2]` (valid JSON, not an object) inserted at
    the given 0-based positions."""
    lines = [json.dumps({"text": f"row {i}", "label": str(i % 2)}) for i in range(good)]
    for position in bad_lines:
        lines.insert(position, "[1, 2]")
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_malformed_rule_counts_the_whole_user_file_not_a_split(tmp_path):
    # 2 bad rows in 302 (0.66%) used to be rejected as "1 of 30 rows" once the dev split drew one.
    task = read_user_task(user_file(tmp_path, 300, [5, 150]))
    assert len(task.skipped) == 2 and len(task.train) + len(task.dev["dev"]) == 300
    # 10 bad rows in 110 is an error, reported against the whole file.
    with pytest.raises(ValueError, match=r"mine.jsonl: 10 of 110 rows are malformed"):
        read_user_task(user_file(tmp_path, 100, list(range(0, 100, 10))))


def test_one_jsonl_reader_for_snli_and_user_files(tmp_path):
    """A line that is JSON but not an object is skipped with the same reason by every reader."""
    task = read_user_task(user_file(tmp_path, 300, [3]))
    assert [(r.line, r.reason) for r in task.skipped] == [(4, "not a JSON object")]
    snli_dir = tmp_path / "snli"
    snli_dir.mkdir()
    labels = ("contradiction", "entailment", "neutral")
    rows = [json.dumps({"premise": f"p {i}", "hypothesis": f"h {i}", "label": labels[i % 3]}) for i in range(300)]
    rows.insert(7, "[1, 2]")
    for split in ("train", "test"):
        (snli_dir / f"{split}.jsonl.gz").write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    snli = read_snli(snli_dir)
    assert ("not a JSON object", 8) in {(r.reason, r.line) for r in snli.skipped}


def test_user_folder_with_train_dev_test(tmp_path):
    folder = tmp_path / "mytask"
    folder.mkdir()
    for split, n in (("train", 120), ("dev", 30), ("test", 30)):
        (folder / f"{split}.tsv").write_text(
            "text\ttext_pair\tlabel\n" + "".join(f"q {i}\ta {i}\t{i % 3}\n" for i in range(n)))
    (task,) = load_tasks(str(folder))
    assert task.spec.name == "mytask" and task.spec.labels == ("0", "1", "2") and task.spec.kind == "classification"
    assert (len(task.train), len(task.dev["dev"]), len(task.test)) == (120, 30, 30)


def test_label_fraction_subsets_are_nested_seeded_and_class_balanced(tmp_path):
    rows = [{"text": f"row {i}", "label": "a" if i % 4 else "b"} for i in range(400)]  # 300 a, 100 b
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:20]))
    task = read_user_task(tmp_path)
    subsets = {f: label_subset(task, f) for f in (0.01, 0.1, 0.5, 1.0)}
    assert subsets[1.0] is task
    counts = {f: {label: t.train.labels.count(label) for label in (0, 1)} for f, t in subsets.items()}
    assert counts[0.1] == {0: 30, 1: 10} and counts[0.01] == {0: 3, 1: 1}  # each class keeps its share
    texts = {f: set(t.train.text) for f, t in subsets.items()}
    assert texts[0.01] < texts[0.1] < texts[0.5] < texts[1.0]  # nested
    assert label_subset(task, 0.1).train.text == subsets[0.1].train.text  # seeded: the same every time
    assert subsets[0.1].dev == task.dev and "0.1 of the training labels: 40 of 400 (class-balanced" in subsets[0.1].notes[-1]


@pytest.mark.parametrize("name,content,message", [
    ("labels.tsv", "text\tlabel\n" + "".join(f"row {i}\t{i % 2}\n" for i in range(20)) + "odd\tnan\n",
     r"labels.tsv, line 22: label 'nan' is not a finite number"),
    ("scores.csv", "text,label\n" + "".join(f"row {i},{i / 7:.3f}\n" for i in range(20)) + "odd,inf\n",
     r"scores.csv, line 22: label 'inf' is not a finite number"),
    ("latin1.csv", "text,label\nfine,a\ncaf\xe9,b\n".encode("latin-1"), r"latin1.csv, line 3: not UTF-8 \(byte 0xe9\)"),
    ("huge.csv", "text,label\nfine,a\n" + "x" * (200 * 1024) + ",b\n",
     r"huge.csv, line 3: not a readable CSV row \(field larger than field limit"),
    ("numbers.jsonl", '{"text": "fine", "label": "a"}\n{"text": 5, "label": "b"}\n',
     r"numbers.jsonl, line 2: 'text' is 5, not a string"),
])
def test_a_bad_user_file_is_one_error_naming_the_file_and_line(tmp_path, name, content, message):
    """Each of these used to be a traceback (ValueError, OverflowError, UnicodeDecodeError, _csv.Error,
    or a TypeError in the tokenizer for a number as text)."""
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(UserError, match=message):
        read_user_task(path)
