"""GPU diagnosis of the Triton attention kernels: (A) correctness over small tiles and dtypes, (B) every
candidate tile of each kernel at base (B 32, 12 heads, T 512, d 64, bf16, dropout 0.1): time and error."""
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

sys.path.insert(0, os.getcwd())
from model import ModelConfig
from model.attention import RelativePositionBias, attention_bias, reference_attention
from model.kernels import attention as K

SMALL = os.environ.get("SMALL") == "1"
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
KERNELS = {"forward": K._forward_kernel, "dkdv": K._backward_dkdv_kernel, "dq": K._backward_dq_kernel}
CANDIDATES = {
    "forward": [(64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 3), (32, 128, 8, 2),
                (128, 64, 4, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 2), (128, 32, 4, 2)],
    "dkdv": [(64, 64, 4, 2), (64, 64, 8, 2), (32, 64, 8, 3), (64, 32, 8, 2), (128, 32, 8, 1), (32, 32, 8, 2),
             (32, 64, 4, 2), (64, 128, 8, 2), (32, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 2), (32, 128, 4, 2),
             (16, 64, 4, 2), (16, 128, 4, 2)],
    "dq": [(64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 1), (64, 32, 8, 2), (32, 128, 8, 2), (128, 32, 8, 2),
           (128, 64, 8, 2), (128, 64, 4, 2), (64, 128, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 2)],
}
if SMALL:
    CANDIDATES = {kind: [(32, 32, 4, 2), (16, 32, 4, 2)] for kind in CANDIDATES}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def problem(batch, heads, T, d, dtype, lengths, max_distance, seed=0):
    torch.manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, T, d, device=DEV).to(dtype) for _ in range(3))
    cfg = ModelConfig(vocab_size=10, hidden_size=heads * d, num_heads=heads, ffn_size=8,
                      rel_pos_max_distance=max_distance).main
    relative = RelativePositionBias(cfg).to(DEV)
    torch.nn.init.normal_(relative.table.weight)
    mask = None
    if lengths is not None:
        mask = torch.arange(T, device=DEV)[None, :] < torch.tensor(lengths, device=DEV)[:, None]
    by_distance = relative.by_distance(T).detach()
    return q, k, v, by_distance, mask


def reference(q, k, v, by_distance, mask, p, keep, dout):
    """fp32 output and gradients (q, k, v, bias by distance) with the kernel's keep mask."""
    T = q.shape[2]
    S = (by_distance.shape[1] - 1) // 2
    bd = by_distance.clone().requires_grad_()
    i = torch.arange(T, device=DEV)
    pairwise = bd[:, (i[None, :] - i[:, None]).clamp(-S, S) + S].unsqueeze(0)
    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
    out = reference_attention(qf, kf, vf, attention_bias(mask, pairwise, torch.float32), K.dropout_rate(p), keep)
    grads = torch.autograd.grad(out, [qf, kf, vf, bd], dout.float())
    return out.detach(), grads


def launch_at(launch, m, n, w, st):
    q = launch.arguments[0]
    batch, heads, T, _ = q.shape
    extra = {"ROWS": min(m, n)} if launch.kind == "dkdv" else {}
    grid = (triton.cdiv(T, m if launch.blocks_of == "BLOCK_M" else n), batch * heads)
    KERNELS[launch.kind][grid](*launch.arguments, **launch.constants, BLOCK_M=m, BLOCK_N=n, num_warps=w,
                               num_stages=st, **extra)


import triton  # noqa: E402


def launches(q, k, v, by_distance, mask, p, seed, out=None, lse=None, dout=None):
    fwd, out0, lse0 = K._forward_launch(q, k, v, by_distance, mask, seed, p)
    if out is None:
        return fwd, out0, lse0
    (dkdv, dq), grads = K._backward_launches(dout, q, k, v, out, lse, by_distance, mask, seed, p, "diagonal")
    return dkdv, dq, grads


def sweep_small():
    print("== A: small problems (B 2, heads 2, T 40, rows 40 and 23), errors against fp32 with the kernel's mask")
    tiles = [(16, 32)] if SMALL else [(16, 16), (16, 32), (32, 16), (16, 64), (32, 32), (32, 64), (64, 64)]
    for d in (16,) if SMALL else (16, 64):
        for dtype in (torch.float16,) if SMALL else (torch.float16, torch.bfloat16, torch.float32):
            for p in (0.25, 0.0):
                q, k, v, bd, mask = problem(2, 2, 40, d, dtype, [40, 23], 16)
                seed = torch.tensor(1234, dtype=torch.int64, device=DEV)
                keep = K.dropout_keep_mask(seed, 2, 2, 40, p) if p else None
                dout = torch.randn(q.shape, device=DEV).to(dtype)
                ref_out, ref_g = reference(q, k, v, bd, mask, p, keep, dout)
                for m, n in tiles:
                    w = 4 if m * n <= 4096 else 8
                    try:
                        fwd, out, lse = launches(q, k, v, bd, mask, p, seed)
                        launch_at(fwd, m, n, w, 2)
                        dkdv, dq, (gq, gk, gv, gb) = launches(q, k, v, bd, mask, p, seed, out, lse, dout)
                        launch_at(dkdv, m, n, w, 2)
                        launch_at(dq, m, n, w, 2)
                        errors = [rel(out, ref_out), rel(gq * 1, ref_g[0]), rel(gk, ref_g[1]), rel(gv, ref_g[2]),
                                  rel(gb, ref_g[3])]
                        bad = " <-- BAD" if max(errors) > (3e-2 if dtype != torch.float32 else 1e-4) else ""
                        print(f"d {d:3d} {str(dtype)[6:]:8s} p {p:4} tile {m:3d}x{n:<3d} w{w}: out {errors[0]:.1e} "
                              f"dq {errors[1]:.1e} dk {errors[2]:.1e} dv {errors[3]:.1e} dbias {errors[4]:.1e}{bad}",
                              flush=True)
                    except Exception as error:
                        print(f"d {d} {dtype} p {p} tile {m}x{n}: {type(error).__name__}: {str(error)[:200]}")


def base_problem():
    B = 2 if SMALL else 32
    T = 40 if SMALL else 512
    q, k, v, bd, mask = problem(B, 12 if not SMALL else 2, T, 64 if not SMALL else 16,
                                torch.float32 if SMALL else torch.bfloat16, None, 128)
    seed = torch.tensor(42, dtype=torch.int64, device=DEV)
    return q, k, v, bd, mask, seed


def compile_one(kind, tile):
    """In a worker: launch once (compiles into Triton's on-disk cache)."""
    try:
        q, k, v, bd, mask, seed = base_problem()
        q, k, v = q[:1], k[:1], v[:1]
        fwd, out, lse = launches(q, k, v, bd, mask, 0.1, seed)
        if kind == "forward":
            launch_at(fwd, *tile)
        else:
            launch_at(fwd, 64, 64, 4, 2)
            dkdv, dq, _ = launches(q, k, v, bd, mask, 0.1, seed, out, lse, torch.randn_like(q))
            launch_at(dkdv if kind == "dkdv" else dq, *tile)
        torch.cuda.synchronize()
        return kind, tile, "ok"
    except Exception as error:
        return kind, tile, f"{type(error).__name__}: {str(error).splitlines()[0][:150]}"


def sweep_tiles():
    print("== B: every candidate tile at base (bf16, dropout 0.1), ms per launch and error against fp32")
    compiled = {}
    if DEV.type == "cuda":
        start = time.time()
        jobs = [(kind, tile) for kind, tiles in CANDIDATES.items() for tile in tiles]
        with ProcessPoolExecutor(12, mp_context=__import__("multiprocessing").get_context("spawn")) as pool:
            for kind, tile, status in pool.map(compile_one, *zip(*jobs)):
                compiled[(kind, tile)] = status
        print(f"compiled {len(jobs)} in {time.time() - start:.0f} s", flush=True)
    q, k, v, bd, mask, seed = base_problem()
    p = 0.1
    keep = K.dropout_keep_mask(seed, *q.shape[:3], p)
    dout = torch.randn(q.shape, device=DEV).to(q.dtype)
    ref_out, ref_g = reference(q, k, v, bd, mask, p, keep, dout)
    del keep
    fwd, out, lse = launches(q, k, v, bd, mask, p, seed)
    launch_at(fwd, 64, 64, 4, 2)
    dkdv, dq, (gq, gk, gv, gb) = launches(q, k, v, bd, mask, p, seed, out, lse, dout)
    bench = (lambda f: triton.testing.do_bench(f, warmup=5, rep=30)) if DEV.type == "cuda" else (lambda f: (f(), 0.0)[1])
    best = {}
    for kind, tiles in CANDIDATES.items():
        for tile in tiles:
            status = compiled.get((kind, tile), "ok")
            if status != "ok":
                print(f"{kind:7s} {tile}: {status}")
                continue
            launch = {"forward": fwd, "dkdv": dkdv, "dq": dq}[kind]
            try:
                gb.zero_()
                launch_at(launch, *tile)
                if kind == "forward":
                    errors = f"out {rel(out, ref_out):.1e}"
                elif kind == "dkdv":
                    errors = f"dk {rel(gk, ref_g[1]):.1e} dv {rel(gv, ref_g[2]):.1e} dbias {rel(gb, ref_g[3]):.1e}"
                else:
                    errors = f"dq {rel(gq, ref_g[0]):.1e}"
                ms = bench(lambda: launch_at(launch, *tile))
                best.setdefault(kind, []).append((ms, tile))
                print(f"{kind:7s} {tile}: {ms:.3f} ms  {errors}", flush=True)
            except Exception as error:
                print(f"{kind:7s} {tile}: {type(error).__name__}: {str(error)[:200]}")
        launch_at(fwd, 64, 64, 4, 2)  # the forward's out and lse back at the reference tile for the backward
    for kind, rows in best.items():
        print(f"best {kind}: " + ", ".join(f"{tile} {ms:.3f}" for ms, tile in sorted(rows)[:4]))
    # what the autotuner picks, through the op
    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
    bdd = bd.clone().requires_grad_()
    o = K.relative_attention(qq, kk, vv, bdd, mask, p, seed)
    o.backward(dout)
    torch.cuda.synchronize() if DEV.type == "cuda" else None
    for name, tuned in (("forward", K._forward_tuned), ("dkdv", K._dkdv_tuned), ("dq", K._dq_tuned)):
        print(f"autotuner's choice {name}: {getattr(tuned, 'best_config', None)}")


if __name__ == "__main__":
    if "A" in sys.argv[1:]:
        sweep_small()
    if "B" in sys.argv[1:]:
        sweep_tiles()
