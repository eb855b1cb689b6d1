"""Export to transformers (offline round trip) and the micro-benchmark's CPU smoke run."""

import subprocess
import sys
from pathlib import Path

import torch

from model import ObjectiveConfig, build_pretraining_model, model_size
from model.bench import run
from model.export import export_encoder

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
        [sys.executable, "-m", "model.bench", "--preset", "tiny", "--seq-len", "32", "--batch-size", "2", "--steps", "1",
         "--variant", "electra", "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    assert "tokens/s" in out.stdout and "model FLOPs/step" in out.stdout
