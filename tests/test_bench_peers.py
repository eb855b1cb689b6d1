"""The benchmark against transformers peers: CPU smoke runs at the tiny preset, the peers' structure,
and every FLOP count the MFU ratio rests on checked against torch's own FlopCounterMode."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from model import VARIANTS
from bench.cli import build_parser, main
from bench.peers import build_peer, peer_step_flops
from bench.steps import BenchResult, bench_config, targets
from model.corruption import random_batch
from model.flops import step_flops
from model.objective import build_pretraining_model

pytest.importorskip("transformers")


@pytest.mark.parametrize("variant,peer", [("cocolm", "hf-electra"), ("roberta_mlm", "hf-roberta")])
def test_cli_prints_ours_the_peer_and_the_ratios(capsys, monkeypatch, variant, peer):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    main(["--preset", "tiny", "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--warmup", "1",
          "--variant", variant, "--peer", peer, "--device", "cpu"])
    lines = capsys.readouterr().out.splitlines()
    assert f"ours ({variant})" in lines and any(line.startswith(f"peer {peer}") for line in lines)
    for field in ("tokens/s", "step time", "peak memory", "model FLOPs/step", "MFU"):
        assert sum(line.startswith(field + " ") for line in lines) == 2, field  # ours and the peer
    ratios = {line.split()[1]: float(line.split()[-1].rstrip("x")) for line in lines if line.startswith("ours/peer")}
    assert set(ratios) == {"tokens/s", "MFU"} and all(r > 0 for r in ratios.values())


def test_flex_with_attention_dropout_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        main(["--preset", "tiny", "--attention", "flex", "--device", "cpu"])
    assert "--attention-dropout 0" in capsys.readouterr().err


def test_electra_peer_shares_embeddings_between_generator_and_discriminator():
    peer = build_peer("hf-electra", bench_config("tiny", "cocolm")[0])
    embeddings = peer.discriminator.electra.embeddings
    assert peer.generator.electra.embeddings is embeddings
    assert peer.generator.generator_lm_head.weight is embeddings.word_embeddings.weight
    assert peer.generator.config.num_hidden_layers == 1 and peer.discriminator.config.num_hidden_layers == 2  # tiny
    assert peer.generator.config._attn_implementation == "sdpa"


def counted_flops(step) -> int:
    """Forward + backward matmul FLOPs as torch counts them; SDPA's math backend so attention counts on CPU."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        step().backward()
    return counter.get_total_flops()


def tiny_batch(vocab_size: int, crop_fraction: float = 0.9, batch: int = 3, seq_len: int = 40):
    data = random_batch(batch, seq_len, vocab_size, crop_fraction)
    mask_rate = data["mask_positions"].sum().item() / (batch * seq_len)  # the formulas take the expected rate
    return data, mask_rate, batch, seq_len


@pytest.mark.parametrize("peer,variant", [
    ("hf-electra", "cocolm"), ("hf-electra", "electra"), ("hf-roberta", "roberta_mlm"),
])
def test_peer_flop_counts_match_torchs_count(peer, variant):
    model_cfg = bench_config("tiny", variant)[0]
    data, mask_rate, batch, seq_len = tiny_batch(model_cfg.vocab_size)
    model = build_peer(peer, model_cfg).train()
    counted = counted_flops(lambda: model(data))
    count = peer_step_flops(peer, model_cfg, seq_len, batch, mask_rate=mask_rate)
    assert count == pytest.approx(counted, rel=1e-9)


@pytest.mark.parametrize("variant", ["cocolm", "roberta_mlm", "rtd_only", "electra"])
def test_our_flop_count_matches_torchs_count(variant):
    """Ours by the same rules as the peers, so the ratio of MFUs compares like with like."""
    model_cfg, objective_cfg, crop_fraction = bench_config("tiny", variant)
    data, mask_rate, batch, seq_len = tiny_batch(model_cfg.vocab_size, crop_fraction)
    torch.manual_seed(0)
    model = build_pretraining_model(model_cfg, objective_cfg).train()
    counted = counted_flops(lambda: model(data).loss)
    count = step_flops(model_cfg, objective_cfg, seq_len, batch, mask_rate=mask_rate, crop_fraction=crop_fraction)
    # step_flops leaves out SCL's (2B x 2B) similarity matmuls, which grow with the batch, not the tokens.
    assert count == pytest.approx(counted, rel=1e-4 if objective_cfg.use_scl else 1e-9)


def test_peer_all_measures_both_pairs_and_prints_one_table(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    main(["--preset", "tiny", "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--warmup", "1",
          "--peer", "all", "--device", "cpu", "--profile"])
    out = capsys.readouterr().out
    table = out[out.index("side "):].splitlines()
    assert [row.split()[:2] for row in table[1:5]] == [
        ["ours", "cocolm"], ["peer", "hf-electra"], ["ours", "roberta_mlm"], ["peer", "hf-roberta"]]
    assert out.count("Self CPU time total") == 4  # --profile: one operator table per side
    assert "not judged here" in table[-1]  # the targets are for base, T=512 on a GPU


def test_targets_are_judged_against_the_issue_goals():
    def result(flops_per_second: float, mfu: float | None) -> BenchResult:
        return BenchResult("NVIDIA H100 80GB HBM3", 1.0, 1.0, 2**30, flops_per_second, mfu)

    fast = targets(result(4.6e14, 0.46), result(3.0e14, 0.30), attention_dropout=0.0).splitlines()
    assert fast == [
        "target COCO-LM step MFU >= 35%: 46.0% (met; goal 45%: met)",
        "target MFU ours/hf-electra >= 1.3x (attention dropout 0.0): 1.53x (met)",
        "peak memory ours/hf-electra: 1.0 / 1.0 GiB",
    ]
    missed = targets(result(3.4e14, 0.34), result(3.2e14, 0.32), attention_dropout=0.0)
    assert "34.0% (NOT met; goal 45%: NOT met)" in missed and "1.06x (NOT met)" in missed
    paper = targets(result(3.0e14, 0.30), result(2.9e14, 0.29), attention_dropout=0.1).splitlines()
    assert paper[0] == "target MFU ours/hf-electra >= 1.0x (attention dropout 0.1): 1.03x (met)"
    assert not any("step MFU" in line for line in paper)  # the MFU goal is for the fast setting


def test_our_electra_baseline_does_the_electra_peers_work():
    """The electra variant is ELECTRA's step (train-mode sampling, no extra sampling pass, ELECTRA's
    head), so its FLOP count is the transformers ELECTRA peer's to the FLOP."""
    from model.flops import electra_peer_step_flops

    model_cfg, objective_cfg, crop_fraction = bench_config("base", "electra")
    assert step_flops(model_cfg, objective_cfg, 512, 32, crop_fraction=crop_fraction) == pytest.approx(
        electra_peer_step_flops(model_cfg, 512, 32), rel=1e-12)


def test_the_bench_takes_the_jobs_presets_and_resolves_them_as_the_job_does():
    """`--preset study` means the job's study preset here too: its model, objective and vocabulary (the bench
    reads them through the job's one resolver, `jobs.pretraining.config.resolve`)."""
    from jobs.pretraining.config import available_presets, resolve

    choices = next(a.choices for a in build_parser()._actions if a.dest == "preset")
    assert choices == available_presets()
    for preset in available_presets():
        model_cfg, objective_cfg, crop_fraction = bench_config(preset, "cocolm")
        job = resolve(preset)
        assert crop_fraction == job.data.crop_fraction, preset
        assert (model_cfg, objective_cfg) == (job.model, job.objective), preset
        for name in VARIANTS:  # each variant, and the preset's word on it (study-cpu's electra)
            job = resolve(preset, name)
            assert bench_config(preset, name)[:2] == (job.model, job.objective), (preset, name)
    assert bench_config("study-cpu", "electra")[1].electra_head is False


def test_attention_alone_times_each_side_and_names_the_ones_that_cannot_run_here(capsys):
    """`--attention-alone`: one line per side with the forward and forward + backward times, or 'n/a' with
    the error (on a CPU without Triton's interpreter our kernel cannot run, nor SDPA's fused GPU kernels
    with dropout); `--profile` adds each timed side's operator table."""
    main(["--attention-alone", "--preset", "tiny", "--seq-len", "32", "--batch-size", "2", "--attention-dropout", "0",
          "--device", "cpu", "--profile"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("attention alone: preset=tiny B=2 T=32 dropout=0.0")
    sides = {line[:44].strip(): line[44:].split() for line in lines[1:]
             if line.startswith(("triton", "sdpa", "flex"))}
    assert set(sides) == {"triton (ours), bias by distance", "sdpa memory-efficient, bias (1, h, T, T)",
                          "sdpa flash, no bias (the ELECTRA peer's)", "flex, bias (h, T, T) in the kernel"}
    timed = {name: words for name, words in sides.items() if words[0] != "n/a"}
    assert timed, sides  # the CPU's SDPA without dropout runs under the flash name's context (flex: no CPU backward)
    for words in timed.values():
        # both times shown and positive; not forward <= forward + backward: two timings on a busy CPU can
        # come out the other way round (5.8 against 4.9 ms beside another test), and timing is the
        # benchmark's to report, not a test's to assert
        assert words[1] == "ms" and words[3] == "ms" and float(words[0]) > 0 and float(words[2]) > 0
    for words in (w for w in sides.values() if w[0] == "n/a"):
        assert words[1].startswith("(") and "Error" in words[1]
    assert sum(line.startswith("Self CPU time total") for line in lines) == len(timed)  # one profile table per timed side
