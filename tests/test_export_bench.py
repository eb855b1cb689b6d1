"""Export to transformers (offline round trip) and the micro-benchmark's CPU smoke run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import ObjectiveConfig, build_pretraining_model, model_size
from bench.steps import run
from model.export import CODE_MANIFEST, code_hashes, export_encoder, load_export, verify_export

ROOT = Path(__file__).resolve().parents[1]


def test_export_round_trip_gives_equal_hidden_states(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(0)
    main = build_pretraining_model(model_size("tiny", vocab_size=80), ObjectiveConfig()).main.eval()
    export_encoder(main, tmp_path / "export")
    loaded = transformers.AutoModel.from_pretrained(tmp_path / "export", trust_remote_code=True).eval()
    ids = torch.randint(5, 80, (2, 20))
    ids[:, 0] = 2
    ids[1, 13:] = 0
    with torch.no_grad():
        ours = main(ids, ids != 0)
        theirs = loaded(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state
    assert torch.equal(ours, theirs)


def test_bench_smoke_reports_positive_numbers():
    result = run(preset="tiny", seq_len=32, batch=2, steps=2, warmup=1, device="cpu")
    assert result.tokens_per_second > 0 and result.step_seconds > 0
    assert result.flops_per_step > 0 and result.peak_memory_bytes > 0
    assert result.mfu is None  # no bf16 peak known for a CPU


def test_bench_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--preset", "tiny", "--seq-len", "32", "--batch-size", "2", "--steps", "1",
         "--variant", "electra", "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    assert "tokens/s" in out.stdout and "model FLOPs/step" in out.stdout


def test_an_export_records_its_code_and_loading_refuses_a_changed_or_added_file(tmp_path, monkeypatch):
    """An account that can write the export's files (a shared MLflow server's artifacts, a bucket) could
    replace encoder/*.py, which `trust_remote_code=True` runs as whoever loads it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    main = build_pretraining_model(model_size("tiny", vocab_size=80), ObjectiveConfig()).main.eval()
    export = export_encoder(main, tmp_path / "encoder")
    recorded = json.loads((export / CODE_MANIFEST).read_text())["sha256"]
    assert set(recorded) == {p.name for p in export.glob("*.py")} >= {"hf_modeling.py", "encoder.py"}
    ids = torch.randint(5, 80, (1, 12))
    with torch.no_grad():
        assert torch.equal(load_export(export).eval()(input_ids=ids).last_hidden_state, main(ids, None))

    planted = tmp_path / "planted"
    original, manifest = (export / "encoder.py").read_text(), (export / CODE_MANIFEST).read_text()
    (export / "encoder.py").write_text(original + f"\nimport pathlib; pathlib.Path({str(planted)!r}).touch()\n")
    with pytest.raises(ValueError, match=r"refusing to load .* encoder.py is not the file the export recorded"):
        load_export(export)
    # The manifest rewritten to match: still not this checkout's code.
    (export / CODE_MANIFEST).write_text(json.dumps({"sha256": code_hashes(export)}))
    with pytest.raises(ValueError, match=r"encoder.py differs from this checkout's model/encoder.py"):
        load_export(export)
    assert not planted.exists()  # refused, unrun

    (export / "encoder.py").write_text(original)
    (export / CODE_MANIFEST).write_text(manifest)
    verify_export(export)  # as exported: accepted
    (export / "extra.py").write_text("raise SystemExit\n")  # a module the manifest does not list
    with pytest.raises(ValueError, match="extra.py is not listed in its code_manifest.json"):
        verify_export(export)
    (export / "extra.py").unlink()
    config = json.loads((export / "config.json").read_text())
    config["auto_map"]["AutoModel"] = "someone/else--hf_modeling.COCOLMModel"  # code from another hub repo
    (export / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="auto_map names someone/else--hf_modeling"):
        verify_export(export)
