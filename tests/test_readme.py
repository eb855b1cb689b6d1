"""The README's commands as a new user meets them: every one is run by a test, or is marked as needing a
GPU, a cloud account or hours; every flag it shows exists; the short CPU ones run here as written and
print what the README says they print."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import as_a_users_shell

ROOT = Path(__file__).resolve().parents[1]
# The README and the reference pages its journeys link: their commands are checked alike.
DOCUMENTS = ("README.md", "docs/pretraining.md", "docs/finetuning.md", "docs/studies.md", "docs/gpu.md",
             "docs/cluster.md", "docs/code.md")
README = "\n".join((ROOT / name).read_text() for name in DOCUMENTS)

# Each README command (a line of a shell block, continuations joined, comments dropped), by the regex
# that recognises it, with who runs it. "run here" ones run below in a fresh folder, as written.
RUN_HERE = "run here"
COMMANDS = {
    r"^python3 -m venv .venv && . .venv/bin/activate && pip install -e \. && python -m jobs\.pretraining":
        "the demo: the README's first Quickstart block, run on a fresh machine before every release",
    r"^bash tests/system_packages\.sh && python3 -m venv": "the test command: .ci/run runs it as written",
    r"^export RAY_AUTH_MODE=token$|^ray get-auth-token|^ray start --head|^python -m jobs\.submit -- python -m "
    r"jobs\.pretraining --preset tiny|^ray job logs":
        "tests/test_pretrain.py::test_a_killed_run_resubmitted_as_a_ray_job_resumes_in_its_mlflow_run_and_recovers_"
        "from_a_worker_failure (the local cluster flow)",
    r"^ray stop$": "Ray's own command; that test ends only the Ray it started (`ray stop` ends every Ray of the user)",
    r"^\(umask 077 && mkdir -p ~/\.ray|^ray up cluster\.yaml|^ray dashboard cluster\.yaml|^ray down cluster\.yaml|"
    r"^export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH|^python -m jobs\.submit --runtime-env|"
    r"^\(umask 077 && cp platform/runtime_env\.yaml|^python -m jobs\.preflight --strict|^pip install -e '\.\[aws\]'|"
    r"^V=\$\(python -c|^REGISTRY=|^docker build|^aws ecr|^STORAGE_BUCKET=|^kubectl ":
        "needs Docker or a cloud account (docs/cluster.md); tests/test_preflight.py and tests/test_platform.py check "
        "the files",
    r"^python -m jobs\.pretraining --preset (tiny --variant cocolm|study-cpu --variant electra)":
        "tests/test_pretrain.py runs the job on the tiny preset; the demo runs this command",
    r"^python -m jobs\.finetuning --from last --tasks snli --grid quick --seeds 5 --dry-run":
        "tests/test_sweep.py::test_a_dry_run_prints_the_plan_first_and_runs_nothing",
    r"^python -m jobs\.finetuning --from RUN_ID --tasks glue --grid paper":
        "needs GLUE's files and GPU-hours; tests/test_readers.py reads GLUE's layouts",
    r"^python -m model\.convert --(from|to)-official cocolm-base":
        "tests/test_convert.py converts the fixture's authors' directory both ways",
    r"^python -m jobs\.data\.tokens cocolm-base-platform":
        "tests/test_official_tokenizer.py runs the command on the fixture's tokenizer",
    r"^(HF_HUB_OFFLINE=0 )?python -m jobs\.finetuning --from microsoft/cocolm-base --tasks glue,squad_v2":
        "needs the released checkpoint (a download), GLUE and GPU-hours; tests/test_encoders.py takes a hub id "
        "from a Hugging Face cache holding the fixture, tests/test_squad.py sweeps the fixture's folder",
    r"^python -m jobs\.pretraining --preset base\+\+ --init-from microsoft/cocolm-base":
        "needs the released checkpoint, a corpus and GPUs; tests/test_continued_pretraining.py runs --init-from "
        "the fixture's folder",
    r"^python -m jobs\.finetuning --from tests/fixtures/official-cocolm --tasks snli --grid quick":
        "tests/test_squad.py::test_a_squad_sweep_of_the_authors_checkpoint_encodes_with_their_tokenizer (the same "
        "folder through --from); run by hand in a fresh clone before a release",
    r"^python -m jobs\.pretraining --preset tiny --init-from tests/fixtures/official-cocolm":
        "tests/test_continued_pretraining.py (the same folder, preset and block length, two steps)",
    r"^python -m jobs\.finetuning --from cocolm-base --tasks rte":
        "needs the released checkpoint (a download) and GLUE; tests/test_encoders.py takes the fixture's folder through --from",
    r"^python -m jobs\.finetuning --from last --tasks my_task\.jsonl":
        "tests/test_sweep.py::test_sweep_end_to_end_with_retries_incomplete_points_and_mlflow (a user task file)",
    r"^python -m jobs\.studies\.ablate --preset study-cpu|^python -m analysis\.report --experiment ablation-study-cpu|"
    r"^python -m analysis\.report --experiment recipe-seq32-(gate|long64)":
        "the CPU studies: hours on 2 cores; their output is committed in docs/measurements/",
    r"^python -m jobs\.studies\.ablate --preset study |^python -m analysis\.report --experiment ablation-study ":
        "GPU-sized (the README says so)",
    r"^python -m jobs\.studies\.ablate --preset tiny --variants cocolm,electra|"
    r"^python -m analysis\.report --experiment ablation-tiny":
        "tests/test_ablate.py and tests/test_report.py run the same path at test size",
    r"^python -m jobs\.data\.pack --seq-len (32|64) --vocab-size 4000 --out work/blocks-study-cpu": RUN_HERE,
    r"^python -m jobs\.studies\.curves --preset study-cpu .*--set train\.max_steps=50 .*--out work/curves/first-look\.csv":
        RUN_HERE,
    r"^python -m jobs\.studies\.curves --preset study-cpu --blocks work/blocks-study-cpu --long-blocks "
    r"work/blocks-study-cpu-64 --variant (cocolm|roberta_mlm)$":
        "3,000 steps each, about 15 minutes on 2 cores; tests/test_curves.py runs the probe at test size",
    r"^python -m jobs\.studies\.curves --plot": "tests/test_curves.py draws CSVs of two variants",
    r"^python -m jobs\.data\.pack --seq-len 128 --vocab-size 8192 --out work/blocks-study$|"
    r"^python -m jobs\.studies\.curves --preset study ": "GPU-sized (the README says so)",
    r"^mlflow ui --backend-store-uri": "tests/test_mlflow_ui.py::test_compare_runs_page_lists_both_variant_runs",
    r"^python -m jobs\.data\.tokenizer --vocab-size 4000 --out work/tokenizer":
        "tests/test_tokenizer.py::test_cli_trains_cased_and_logs_the_directory_to_mlflow (its command on a small corpus)",
    r"^python -m jobs\.data\.stream_bench": "tests/test_stream.py runs the stream it times; a benchmark of a minute",
    r"^python -m jobs\.data\.pack --seq-len 128 --vocab-size 8192 --out work/blocks ":
        "the same command as the study-cpu pack above, at the study preset's length",
    r"^python -m pytest -m gpu|^python -m pytest tests/test_triton_attention\.py|^python -m bench --preset base|"
    r"^python -m bench --gpu-report gpu-report$": "GPU (the README's 'On a GPU' section)",
    r"^python -m bench --gpu-report gpu-report --toy$":
        "tests/test_gpu_report.py::test_the_whole_plan_runs_at_toy_shapes_on_the_cpu",
    r"^python -m model\.kernels\.resources$":
        "tests/test_triton_attention.py::test_every_tuned_tile_compiles_for_an_h100_fits_and_issues_at_most_130_instructions_per_score "
        "(its report, at the default problem)",
}


def shell_commands(text: str) -> list[str]:
    """Every command of the README's shell blocks: continuations joined, comments and blank lines dropped."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(re.sub(r"\s+", " ", line))
    return commands


def python_commands(text: str) -> list[str]:
    """Every `python -m MODULE ...` the README shows, in shell blocks, usage blocks and inline code; a
    line of several commands (`a && b`) gives each."""
    lines = shell_commands(text)
    for block in re.findall(r"```(?:text)?\n(.*?)```", text, re.S):
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines()]
    lines += re.findall(r"`(python -m [^`]+)`", text)
    return [part.strip() for line in lines for part in line.split("&&") if part.strip().startswith("python -m ")]


def classify(command: str) -> str | None:
    matches = [why for pattern, why in COMMANDS.items() if re.search(pattern, command)]
    return matches[0] if len(matches) == 1 else None


def test_every_readme_command_is_run_by_a_test_or_says_why_not():
    unclassified = [c for c in shell_commands(README) if classify(c) is None]
    assert not unclassified, f"README commands with no (or several) entries in COMMANDS: {unclassified}"
    for why in set(COMMANDS.values()):  # a named test exists
        for file, name in re.findall(r"(tests/test_\w+\.py)::(\w+)", why):
            assert f"def {name}(" in (ROOT / file).read_text(), why


# The function behind each `python -m` package (its __main__ calls it; importing a __main__ would run it).
PACKAGE_MAIN = {"jobs.pretraining": "jobs.pretraining.job", "jobs.finetuning": "jobs.finetuning.sweep",
                "jobs.data.tokens": "jobs.data.tokens.__main__", "bench": "bench.cli"}


def help_text(module: str, capsys) -> str:
    """The command's --help, from its own parser, in this process (a new Python per command took 30 s)."""
    import importlib

    main = importlib.import_module(PACKAGE_MAIN.get(module, module)).main
    with pytest.raises(SystemExit) as status:
        main(["--help"])
    assert status.value.code == 0, module
    return capsys.readouterr().out


def test_every_flag_the_readme_shows_exists(capsys, monkeypatch):
    """Usage lines, shell blocks and inline commands alike: a renamed flag fails here, not for a reader."""
    monkeypatch.setenv("COLUMNS", "200")
    helps: dict[str, str] = {}
    missing = []
    for command in python_commands(README):
        words = command.split(" -- ")[0].split()  # after `--` come another command's flags (jobs.submit)
        module = words[words.index("-m") + 1]
        if module == "pytest":
            continue
        for flag in {w.split("=")[0].strip("[]|,") for w in words if w.lstrip("[").startswith("--")}:
            if module not in helps:
                helps[module] = help_text(module, capsys)
            if flag and not re.search(rf"(^|[\s,\[]){re.escape(flag)}([\s,=\]]|$)", helps[module], re.M):
                missing.append(f"python -m {module} {flag}")
    assert not missing, f"flags the README shows that the command does not take: {sorted(set(missing))}"


def readme_command(pattern: str) -> list[str]:
    """The README's command matching `pattern`, as argv, with its optional `[...]` parts left out."""
    (command,) = [c for c in shell_commands(README) if re.search(pattern, c)]
    command = re.sub(r"\s*\[[^\]]*\]", "", command)
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-m"], command
    return [sys.executable, *argv[1:]]


@pytest.mark.slow(seconds=77)
@pytest.mark.timeout(900)
def test_the_short_cpu_commands_run_as_written_and_print_what_the_readme_says(tmp_path):
    """In a fresh folder, as a user in a clone runs them (outputs under work/), one after the other."""
    env = as_a_users_shell({**os.environ, "PYTHONPATH": str(ROOT), "COCOLM_HOME": str(tmp_path / "home"),
                            "COCOLM_CACHE": str(tmp_path / "cache")})

    def run(pattern: str) -> str:
        result = subprocess.run(readme_command(pattern), cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        return result.stdout + result.stderr

    out = run(r"^python -m jobs\.data\.pack --seq-len 32")
    assert re.search(r"packed [\d,]+ blocks of 32 \([\d,]+ tokens, vocabulary 4,000\) into work/blocks-study-cpu", out)
    out = run(r"^python -m jobs\.data\.pack --seq-len 64")  # the long phase's blocks, with the cached tokenizer
    assert re.search(r"packed [\d,]+ blocks of 64 \([\d,]+ tokens, vocabulary 4,000\) into work/blocks-study-cpu-64", out)

    out = run(r"first-look\.csv")
    # the README: a line per log interval with held-out accuracies, step 0 first; the CSV and its figure
    assert "step 0/50 | held-out before training:" in out and re.search(r"step 50/50 \|.*held-out aux_mlm", out)
    assert "curves: work/curves/first-look.csv" in out
    rows = (tmp_path / "work/curves/first-look.csv").read_text().splitlines()
    assert rows[1].startswith("0,") and rows[-1].startswith("50,")
    # the preset's long phase, at first-look size: the last 10 steps on blocks of 64, a line where it starts
    assert "(the last 10 of 32 x 64" in out and re.search(r"step 40/50 \| epoch", out)
    assert "\x1b[" not in out and "%|" not in out  # no colour codes, no progress-bar frames


def test_a_job_sent_to_a_tracking_server_takes_its_account_from_the_one_private_runtime_env():
    """The MLflow recipe puts a user's account in a private copy of platform/runtime_env.yaml; every
    documented `jobs.submit` to a tracking server sends that copy (the shared file has no account, and a
    job sent with it is refused by the server), and the docs make the copy owner-only."""
    recipe = (ROOT / "platform" / "mlflow" / "README.md").read_text()
    assert "*.private.yaml" in recipe and "platform/runtime_env.yaml" in recipe
    submits = [c for c in shell_commands(README) if c.startswith("python -m jobs.submit --runtime-env")
               and "--tracking-uri http" in c]
    assert submits and all("--runtime-env platform/runtime_env.private.yaml " in c for c in submits), submits
    assert "(umask 077 && cp platform/runtime_env.yaml platform/runtime_env.private.yaml)" in README
    assert "*.private.yaml" in (ROOT / ".gitignore").read_text()

