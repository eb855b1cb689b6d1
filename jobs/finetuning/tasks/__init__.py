"""The fine-tuning tasks, one home: what each is, how it is read and scored. `load_tasks` reads what `--tasks`
names into `Task`s: GLUE, SNLI, SQuAD 2.0, or a user's task file or folder.

    load_tasks("glue" | "snli" | "squad_v2" | "glue,squad_v2" | "rte,mrpc" | FILE_OR_FOLDER, data_dir=...)

`data_dir` holds the downloaded benchmark files: the GLUE task folders (`MNLI/train.tsv`, ...) and
SQuAD 2.0's `train-v2.0.json` and `dev-v2.0.json`, side by side. GLUE without a `data_dir` comes from
the Hugging Face hub (`glue.read_glue_hub`); SQuAD 2.0 needs it.

    specs.py          what each task is (labels, metrics, score): GLUE's eight, SNLI, SQuAD 2.0, a user's
    metrics.py        accuracy, F1, Matthews, Pearson, Spearman
    task.py           Task and Split, skipped rows and the malformed-row rule every reader applies
    glue.py, snli.py, user.py, squad.py   the readers
    squad_windows.py  SQuAD questions into model windows, logits back into answers
    squad_eval.py     the official SQuAD 2.0 evaluation (and `python -m jobs.evaluate_squad_v2`)
    subsets.py        fixed-seed row subsets and fractions of the training labels
"""

from __future__ import annotations

from pathlib import Path

from jobs.cli import UserError
from jobs.finetuning.tasks.glue import read_glue_hub, read_glue_task
from jobs.finetuning.tasks.snli import read_snli
from jobs.finetuning.tasks.specs import GLUE, GLUE_ALIASES, SQUAD_V2
from jobs.finetuning.tasks.squad import read_squad_v2
from jobs.finetuning.tasks.task import Task
from jobs.finetuning.tasks.user import read_user_task


def load_tasks(which: str, data_dir: str | Path | None = None, kind: str | None = None) -> list[Task]:
    """A comma list of task names ('glue' standing for all eight), or one user task file or folder."""
    if Path(which).exists():
        return [read_user_task(which, kind)]
    return [_read(name, data_dir) for name in benchmark_task_names(which)]


def benchmark_task_names(which: str) -> list[str]:
    """The benchmark tasks a comma list names, each once in the order given, without reading their data."""
    names = []
    for name in (n.strip().lower() for n in which.split(",") if n.strip()):
        names += list(GLUE) if name == "glue" else [GLUE_ALIASES.get(name, name)]
    unknown = [n for n in names if n not in ("snli", SQUAD_V2.name, *GLUE)]
    if unknown or not names:
        raise UserError(f"--tasks {which!r}: {', '.join(map(repr, unknown or [which]))} is neither a task "
                         f"({['glue', 'snli', SQUAD_V2.name, *GLUE]}) nor an existing file or folder")
    return list(dict.fromkeys(names))


def _read(name: str, data_dir: str | Path | None) -> Task:
    if name == "snli":
        return read_snli()
    if name == SQUAD_V2.name:
        return read_squad_v2(data_dir)
    return read_glue_task(name, data_dir) if data_dir else read_glue_hub(name)
