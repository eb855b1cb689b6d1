"""What `--tasks` names, read into `Task`s: GLUE, SNLI, SQuAD 2.0, or a user's task file or folder.

    load_tasks("glue" | "snli" | "squad_v2" | "glue,squad_v2" | "rte,mrpc" | FILE_OR_FOLDER, data_dir=...)

`data_dir` holds the downloaded benchmark files: the GLUE task folders (`MNLI/train.tsv`, ...) and
SQuAD 2.0's `train-v2.0.json` and `dev-v2.0.json`, side by side. GLUE without a `data_dir` comes from
the Hugging Face hub (`readers.read_glue_hub`); SQuAD 2.0 needs it.
"""

from __future__ import annotations

from pathlib import Path

from jobs.finetuning.readers import Task, read_glue_hub, read_glue_task, read_snli, read_user_task
from jobs.finetuning.specs import GLUE, GLUE_ALIASES, SQUAD_V2
from jobs.finetuning.squad_data import read_squad_v2


def load_tasks(which: str, data_dir: str | Path | None = None, kind: str | None = None) -> list[Task]:
    """A comma list of task names ('glue' standing for all eight), or one user task file or folder."""
    if Path(which).exists():
        return [read_user_task(which, kind)]
    names = []
    for name in (n.strip().lower() for n in which.split(",") if n.strip()):
        names += list(GLUE) if name == "glue" else [GLUE_ALIASES.get(name, name)]
    unknown = [n for n in names if n not in ("snli", SQUAD_V2.name, *GLUE)]
    if unknown or not names:
        raise ValueError(f"--tasks {which!r}: {', '.join(map(repr, unknown or [which]))} is neither a task "
                         f"({['glue', 'snli', SQUAD_V2.name, *GLUE]}) nor an existing file or folder")
    return [_read(name, data_dir) for name in dict.fromkeys(names)]  # each task once, in the order given


def _read(name: str, data_dir: str | Path | None) -> Task:
    if name == "snli":
        return read_snli()
    if name == SQUAD_V2.name:
        return read_squad_v2(data_dir)
    return read_glue_task(name, data_dir) if data_dir else read_glue_hub(name)
