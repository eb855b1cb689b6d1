"""jobs.tracking: the UI links every job prints, and the storage check."""

import urllib.parse

import pytest

from jobs.tracking import check_storage, ui_links


def test_jobs_print_direct_links_to_the_run_the_runs_table_and_the_compare_view():
    local = ui_links("sqlite:////home/u/cocolm-ray/mlflow.db", "3", "abc", compare=["abc", "def"]).splitlines()
    assert local[0].startswith("start the UI:  mlflow ui --backend-store-uri sqlite:////home/u/cocolm-ray/mlflow.db")
    assert local[1] == "this run:      http://127.0.0.1:5000/#/experiments/3/runs/abc"
    assert local[2] == "runs table:    http://127.0.0.1:5000/#/experiments/3/runs"  # not the empty GenAI overview
    compare = urllib.parse.unquote(local[3])
    assert compare == 'compare runs:  http://127.0.0.1:5000/#/compare-runs?runs=["abc", "def"]&experiments=["3"]'
    server = ui_links("http://mlflow.internal:5000/", "7", "abc").splitlines()
    assert server == ["this run:      http://mlflow.internal:5000/#/experiments/7/runs/abc",
                      "runs table:    http://mlflow.internal:5000/#/experiments/7/runs"]  # no local UI to start


def test_storage_must_be_writable(tmp_path):
    check_storage(str(tmp_path / "new" / "dir"))  # created
    assert (tmp_path / "new" / "dir").is_dir() and list((tmp_path / "new" / "dir").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(PermissionError, match=r"storage .*file/sub is not writable"):
        check_storage(str(tmp_path / "file" / "sub"))
    check_storage("s3://bucket/prefix")  # cloud storage is Ray's to check when it first writes
