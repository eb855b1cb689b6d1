"""The repository layout guards of DESIGN.md: platform/ holds no Python; no module shadows the stdlib."""

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


def test_model_imports_no_ray_mlflow_pandas_or_transformers():
    code = (
        "import sys, model, model.bench, model.export\n"
        "print(sorted(m for m in ('ray', 'mlflow', 'pandas', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
