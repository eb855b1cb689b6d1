"""The repository layout guards of docs/design.md section 1: platform/ holds no Python; no module shadows the stdlib."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "jobs", "analysis", "tests")


def test_platform_holds_no_python():
    assert (ROOT / "platform").is_dir()
    assert sorted(ROOT.glob("platform/**/*.py")) == []


def test_no_module_or_package_shadows_the_stdlib():
    names = {path.name for path in ROOT.iterdir() if path.is_dir() and not path.name.startswith(".")}
    names |= {path.stem for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    names |= {path.stem for path in ROOT.glob("*.py")}
    clashes = sorted(names & (set(sys.stdlib_module_names) - {"platform"}))  # platform/ is the known, py-free folder
    assert clashes == []


def test_model_imports_no_ray_mlflow_or_pandas_and_its_core_no_transformers():
    """model/ runs on a GPU machine with plain torch; transformers only in the export, the checkpoint
    conversion, their transformers classes and the benchmark's peers (model.export, model.convert,
    model.hf_*, bench), never in the networks and losses (every other module of model/)."""
    core = ", ".join(f"model.{p.stem}" for p in sorted((ROOT / "model").glob("*.py"))
                     if p.stem not in ("__init__", "export", "convert", "hf_configuration", "hf_modeling"))
    for modules, banned in ((f"model, {core}", ("ray", "mlflow", "pandas", "transformers")),
                            ("model, bench.cli, model.export", ("ray", "mlflow", "pandas"))):
        code = f"import sys, {modules}\nprint(sorted(m for m in {banned!r} if m in sys.modules))"
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "[]", (modules, out.stdout)


def test_the_model_package_loads_each_name_on_first_use_and_its_config_needs_no_torch():
    """`model` exports its names lazily, so `model.config` (a tokenizer's special ids, which Ray Data's
    workers unpickle with a scheme) imports without torch; every exported name still loads."""
    code = ("import sys, model.config\nprint('torch' in sys.modules)\nimport model\n"
            "print([n for n in model.__all__ if getattr(model, n) is None], 'torch' in sys.modules)\n"
            "print(hasattr(model, 'no_such_name'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:3] == ["False", "[] True", "False"], out.stdout + out.stderr


def test_every_module_with_gpu_tests_is_collected_by_a_gpu_run():
    """`-m gpu` collects only conftest.GPU_TEST_MODULES (a GPU machine has no Ray): a gpu test added
    elsewhere would silently never run there."""
    from helpers import GPU_TEST_MODULES

    marker = "@pytest.mark." + "gpu"  # spelled apart so this file does not match itself
    with_gpu_tests = {p.name for p in (ROOT / "tests").glob("test_*.py") if marker in p.read_text()}
    assert with_gpu_tests <= set(GPU_TEST_MODULES), with_gpu_tests - set(GPU_TEST_MODULES)
    for name in GPU_TEST_MODULES:
        imports = [line for line in (ROOT / "tests" / name).read_text().splitlines() if line.startswith(("import ", "from "))]
        assert not any(word in line for line in imports for word in ("ray", "mlflow", "jobs", "pandas")), name


def readme_test_command() -> str:
    """The Quickstart's second shell block, as .ci/run reads it."""
    import re

    quickstart = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(?:bash|sh|shell)\n(.*?)```", quickstart, re.S)[1].strip()


def test_the_readme_test_command_installs_what_the_tests_need_and_ci_installs_nothing_else():
    """CI used to install chromium and g++ itself, so the README's command failed on a fresh machine
    while CI was green. Now the README's command installs them, and .ci/run only runs that command."""
    command = readme_test_command()
    assert command.startswith("bash tests/system_packages.sh && ") and "python -m pytest" in command
    script = (ROOT / "tests" / "system_packages.sh").read_text()
    for package in ("chromium", "g++"):
        assert f"missing+=({package})" in script
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in ci and "pip install" not in ci


# What a clone cannot follow: the project's former outside documents by name, and paths outside the
# repository. Spelled apart so that this file does not match itself.
OUTSIDE_REFERENCES = re.compile("|".join((r"\bSP" + r"EC\b", r"\bDES" + r"IGN\b", re.escape("../sha" + "red"),
                                          re.escape("/wo" + "rk/"))))
CITED_DOC = re.compile(r"(?<![\w-])docs/([\w.+-]+?)\.md\b")
# .gitignore ignores the repository's own work/ folder with a rooted pattern, which looks like an outside path.
NOT_SCANNED = {".gitignore"}


def repository_files() -> list[str]:
    """Every file a commit of this tree holds: the tracked ones and the untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    return sorted({name for name in listed.split("\0") if name} - NOT_SCANNED)


def test_every_document_the_repository_cites_is_in_it():
    """References to documents outside the repository, or to a `docs/*.md` that does not exist, are
    dead links in a user's clone: each is listed as file:line."""
    problems = []
    for name in repository_files():
        try:
            data = (ROOT / name).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue  # deleted in the working tree, or a submodule
        if b"\0" in data:
            continue  # binary (the gzipped corpus and SNLI)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_REFERENCES.search(line):
                problems.append(f"{name}:{number}: {line.strip()}")
            problems += [f"{name}:{number}: docs/{doc}.md does not exist" for doc in CITED_DOC.findall(line)
                         if not (ROOT / "docs" / f"{doc}.md").is_file()]
    assert problems == [], "\n".join(problems)


# A repository path as the documents cite one; placeholders (NAME, <id>, globs) are no paths.
CITED_PATH = re.compile(r"(?<![\w/.-])((?:docs|platform|jobs|model|bench|tests|analysis|data)/[\w./+-]*[\w/])")
PLACEHOLDER = re.compile(r"[A-Z]{3,}|[*<{]")
USER_MADE = re.compile(r"\.private\.yaml$|/\.env$")  # files a user creates from a recipe, never committed


def test_every_file_the_documents_cite_exists():
    """The README and docs/*.md name files and folders of the repository (`platform/presets/...`,
    `docs/measurements/...`): a renamed or moved one is a dead reference for a reader."""
    problems = []
    for document in ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate((ROOT / document).read_text().splitlines(), start=1):
            for cited in CITED_PATH.findall(line):
                path = cited.rstrip(".")
                if PLACEHOLDER.search(path) or USER_MADE.search(path):
                    continue
                module_attribute = path.endswith(tuple(f".{w}" for w in re.findall(r"\.(\w+)$", path) if w != "py"))
                if not (ROOT / path).exists() and not (module_attribute and (ROOT / path.rsplit(".", 1)[0]).with_suffix(".py").exists()):
                    problems.append(f"{document}:{number}: {cited}")
    assert problems == [], "\n".join(problems)


def test_every_measurement_folder_is_in_the_index():
    """docs/measurements/README.md is where a reader finds what each folder showed and what superseded it."""
    index = (ROOT / "docs" / "measurements" / "README.md").read_text()
    folders = [p.name for p in (ROOT / "docs" / "measurements").iterdir() if p.is_dir()]
    assert folders and [name for name in folders if f"{name}/" not in index and f"`{name}`" not in index] == []


def test_every_module_imports_at_the_top():
    """Dependencies are visible at the top of each file: only the optional packages (datasets for GLUE
    from the hub, matplotlib for figures) are imported inside functions."""
    optional = {"datasets", "matplotlib"}
    inside = []
    for path in sorted(p for package in ("model", "jobs", "analysis") for p in (ROOT / package).rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, ast.Import):
                        modules = [alias.name for alias in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        modules = ["." * node.level + (node.module or "")]
                    else:
                        continue
                    inside += [f"{path.relative_to(ROOT)}:{node.lineno} {m}" for m in modules
                               if m.split(".")[0] not in optional]
    assert inside == []


def test_analysis_depends_on_jobs_and_never_the_reverse():
    """The data flows corpus -> stream -> pretraining -> checkpoint -> fine-tuning -> analysis."""
    for path in (ROOT / "jobs").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("analysis"), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("analysis") for a in node.names), path.name


def test_the_modules_ray_data_workers_import_stay_light():
    """Every Ray Data worker of a run imports the UDFs' modules (jobs.data.corpus, jobs.data.packing) and the
    platform scheme it unpickles (jobs.data.tokens): they must not pull in torch, Ray Train, tokenizer
    training or tracking (transformers, sentencepiece, mlflow: seconds per worker; torch and Ray Train
    cost 2 s in each of the 4 workers of a 2-step run)."""
    assert heavy_imports_of(["jobs.data.corpus", "jobs.data.packing", "jobs.data.tokens"],
                            ["torch", "ray.train", "transformers", "sentencepiece", "mlflow"]) == []


def test_the_modules_a_tune_trial_actor_imports_stay_light():
    """A new Ray Tune trial actor imports the module of everything it unpickles: the trainable (jobs.finetuning.actor),
    the job's trial (trial.py, fewshot_trial.py), its name function (grid.py) and the PretrainedEncoder
    (jobs.pretraining.pretrained). MLflow, transformers and the hub are the driver's: 3 s of every actor's start."""
    assert heavy_imports_of(["jobs.finetuning.actor", "jobs.finetuning.trial", "jobs.finetuning.fewshot_trial",
                             "jobs.finetuning.grid", "jobs.pretraining.pretrained"],
                            ["mlflow", "transformers", "huggingface_hub"]) == []


def test_the_module_a_skip_counter_actor_imports_stays_light():
    """Every corpus read starts a SkipCounter actor, whose process imports the module that defines it
    (jobs.data.skips): Ray Data and pyarrow, which jobs.data.corpus needs, cost each a third of a core-second."""
    assert heavy_imports_of(["jobs.data.skips"], ["ray.data", "pyarrow", "torch"]) == []


def test_what_a_ray_train_controller_unpickles_stays_light():
    """Ray Train's controller unpickles the loop's config (jobs.pretraining.job.loop_config), once a run on the
    head node: the loop's module and PretrainConfig's bring MLflow, the model's backends and triton (a
    core-second and about 115 MB more per run). The workers get the same config back (tests/test_pretrain.py)."""
    import pickle

    from jobs.pretraining.config import resolve
    from jobs.pretraining.context import LoopContext
    from jobs.pretraining.job import loop_config

    config = pickle.dumps(loop_config(resolve("tiny"), LoopContext("run", "sqlite:///mlflow.db", "tokenizer")))
    assert heavy_imports_of(["pickle"], ["mlflow", "triton", "jobs.pretraining.config", "jobs.pretraining.loop"],
                            then="pickle.loads(sys.stdin.buffer.read())", stdin=config) == []


def heavy_imports_of(modules: list[str], heavy: list[str], then: str = "", stdin: bytes = b"") -> list[str]:
    """Which of `heavy` a fresh Python has imported once it imported `modules` (and ran `then`, which may read
    `stdin`): what a Ray worker that unpickles objects of those modules pays for at its start."""
    code = f"import sys, {', '.join(modules)}\n{then}\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, input=stdin, capture_output=True, check=True)
    return ast.literal_eval(out.stdout.decode().strip())
