"""The attention kernels compiled ahead of time for a GPU that is not here, and what each one needs there.

Triton compiles for any NVIDIA architecture without a device (its wheel ships ptxas and cuobjdump), so a
CPU machine can show that every kernel, at every tile its autotuning may pick (`TILES`), compiles for the
GPU, and what it takes there per block of threads: shared memory (against the architecture's limit),
registers per thread, and local memory per thread (registers spilled to memory: slower, never wrong).

    python -m model.kernels.resources                     # sm_90 (H100), bf16, head size 64, bias, dropout
    python -m model.kernels.resources --sass              # and each main loop's instructions
    python -m model.kernels.resources --arch 80 --dtype fp16 --head-dim 128 --padding --no-dropout

Each kernel is compiled as the runtime launches it for base's problem (B 32, 12 heads, T 512, S 86): the
launchers' own arguments (`attention.Launch`), on meta tensors laid out as the encoder's, specialised by
Triton's own binder, so the integer and pointer divisibility by 16 that a launch gives is in the binary.
`--sass` disassembles each binary (cuobjdump -sass) and counts the instructions of its main loop, the
one that ends in the branch back to its start: per thread per tile, and per score element (times the
threads of a block, over the tile's M x N scores), the unit in which the kernels are compared (docs/design.md
7.2). It exits with 1 if a tile fails to compile or needs more shared memory than the architecture has.
The tiles in `TILES` were chosen with it; which of them is fastest only a GPU can say.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch

from model.kernels import attention as kernels

if kernels.TRITON_MISSING is None:  # else `kernel_functions` says what is missing
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

# Shared memory one block may use, in bytes (the CUDA C++ Programming Guide's compute capability table,
# with the opt-in maximum): A100, RTX 30xx, RTX 40xx / L4 / L40, H100 / H200.
SHARED_MEMORY_PER_BLOCK = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# The tile the main loops are compared at: every kernel's one choice before tuning.
COMPARED_TILE = (64, 64, 4, 2)


@dataclass(frozen=True)
class Problem:
    """What a kernel is compiled for, besides its tiles: the constexpr flags it is specialised on."""

    dtype: str = "bf16"
    head_dim: int = 64
    bias: bool = True
    padding: bool = False
    dropout: bool = True
    bias_gradient: str = "diagonal"
    batch: int = 32
    heads: int = 12
    seq_len: int = 512
    reach: int = 86  # S, the distance from which the paper's 32 buckets (max distance 128) saturate
    dropout_p: float = 0.1


@dataclass(frozen=True)
class Resources:
    shared: int  # bytes per block
    registers: int | None  # per thread; None where cuobjdump could not read the binary
    spilled: int | None  # bytes of local memory per thread
    loop: int | None = None  # instructions per thread in one pass of the main loop (one tile); None: not counted


def kernel_functions() -> dict:
    if kernels.TRITON_MISSING is not None:
        raise RuntimeError(f"compiling the kernels needs triton ({kernels.TRITON_MISSING})")
    if kernels.interpreted():
        raise RuntimeError("TRITON_INTERPRET=1 is set: the kernels are interpreted here, not compiled")
    return {"forward": kernels._forward_kernel, "dkdv": kernels._backward_dkdv_kernel,
            "dq": kernels._backward_dq_kernel}


def launches(problem: Problem) -> dict[str, kernels.Launch]:
    """Each kernel's launch as the runtime makes it for `problem`, on meta tensors (no memory, no device):
    q, k, v strided views of one fused projection (B, T, 3, heads, d) as in the encoder, the output's
    gradient laid out (B, T, heads, d) like the output, the bias by distance (heads, 2S + 1)."""
    meta = torch.device("meta")
    batch, heads, seq_len, dim = problem.batch, problem.heads, problem.seq_len, problem.head_dim
    dtype = DTYPES[problem.dtype]
    qkv = torch.empty((batch, seq_len, 3, heads, dim), dtype=dtype, device=meta).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    bias = torch.empty((heads, 2 * problem.reach + 1), device=meta) if problem.bias else None
    key_mask = torch.empty((batch, seq_len), dtype=torch.bool, device=meta) if problem.padding else None
    dropout_p = problem.dropout_p if problem.dropout else 0.0
    seed = torch.empty((), dtype=torch.int64, device=meta) if dropout_p else None
    every = kernels.every_distance(bias, seq_len) if problem.bias else None
    forward, out, lse = kernels._forward_launch(q, k, v, every, key_mask, seed, dropout_p)
    dout = kernels._transposed_like(q)
    (dq, dkdv), _ = kernels._backward_launches(dout, q, k, v, out, lse, bias, every, key_mask, seed, dropout_p,
                                               problem.bias_gradient if problem.bias else "none")
    return {"forward": forward, "dkdv": dkdv, "dq": dq}


def compile_for(arch: int, kind: str, problem: Problem, tile: tuple[int, int, int, int]):
    """The kernel compiled for sm_{arch} at `tile` (query block, key block, warps, stages), no GPU needed:
    the launch's arguments go through Triton's binder, as `JITFunction.run` does on a GPU, so the binary
    has the launch's specialisations (an integer or pointer divisible by 16, an integer equal to 1)."""
    function = kernel_functions()[kind]
    launch = launches(problem)[kind]
    tiles = {"BLOCK_M": tile[0], "BLOCK_N": tile[1],
             **({"ROWS": kernels._rotated_rows(*tile[:2])} if kind == "dkdv" else {})}
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    keywords = {**launch.constants, **tiles, "num_warps": tile[2], "num_stages": tile[3]}
    bound, specialization, options = create_function_from_signature(function.signature, function.params, backend)(
        *launch.arguments, **keywords)
    options, types, constexprs, attrs = function._pack_args(backend, keywords, bound, specialization, options)
    return kernels.triton.compile(ASTSource(function, types, constexprs, attrs), target=target,
                                  options=options.__dict__)


def _tool(name: str) -> str:
    """A CUDA binary tool shipped in triton's wheel."""
    return os.path.join(os.path.dirname(kernels.triton.__file__), "backends", "nvidia", "bin", name)


def _binary_tool(compiled, *flags: str) -> str | None:
    """The output of cuobjdump with `flags` on the compiled kernel's binary; None without cuobjdump."""
    if not os.path.exists(_tool("cuobjdump")):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as binary:
        binary.write(compiled.asm["cubin"])
        binary.flush()
        return subprocess.run([_tool("cuobjdump"), *flags, binary.name], capture_output=True, text=True).stdout


SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?:\.\S+)?\s+(?:`\()?(0x[0-9a-f]+)")


def main_loop(sass: str) -> list[str]:
    """The instructions of the main loop in a SASS listing: from the target of the branch back (to a lower
    address) that spans the most instructions, through that branch. A branch to itself (the trap at the
    end of every kernel) is no loop."""
    instructions = [(int(found.group(1), 16), found.group(2)) for found in map(SASS_LINE.search, sass.splitlines())
                    if found]
    best: list[str] = []
    for address, text in instructions:
        branch = BRANCH.match(text)
        if branch and int(branch.group(1), 16) < address:
            body = [line for at, line in instructions if int(branch.group(1), 16) <= at <= address]
            best = max(best, body, key=len)
    return best


def resources(compiled, sass: bool = False) -> Resources:
    """Shared memory from Triton's metadata; registers and local memory from the binary (cuobjdump), and
    with `sass` the instructions of its main loop."""
    registers = spilled = loop = None
    found = re.search(r"REG:(\d+) STACK:(\d+)", _binary_tool(compiled, "--dump-resource-usage") or "")
    if found:
        registers, spilled = int(found.group(1)), int(found.group(2))
    if sass:
        loop = len(main_loop(_binary_tool(compiled, "-sass") or "")) or None
    return Resources(compiled.metadata.shared, registers, spilled, loop)


def per_score(loop: int, tile: tuple[int, int, int, int]) -> float:
    """A main loop's instructions per thread, as instructions per score element: one pass covers one
    M x N tile with 32 x warps threads."""
    return loop * 32 * tile[2] / (tile[0] * tile[1])


def report(arch: int, problem: Problem, tiles: dict | None = None, sass: bool = False) -> tuple[list[str], bool]:
    """One line per kernel and tile, and whether every one compiled and fits the shared memory; with
    `sass` each line adds its main loop's instructions and a last line sums them at `COMPARED_TILE`."""
    limit = SHARED_MEMORY_PER_BLOCK[arch]
    lines, ok, compared = [], True, {}
    for kind, candidates in (tiles or kernels.TILES).items():
        for tile in candidates:
            name = f"{kind:8} {tile[0]:>3} x {tile[1]:<3} {tile[2]} warps {tile[3]} stages"
            try:
                used = resources(compile_for(arch, kind, problem, tile), sass)
            except Exception as error:  # a compile failure is what this reports
                lines.append(f"{name}  FAILED: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                ok = False
                continue
            fits = used.shared <= limit
            ok &= fits
            line = (f"{name}  shared {used.shared:>7,} B{'' if fits else ' > ' + format(limit, ',')}"
                    f"  registers {used.registers if used.registers is not None else '?':>3}"
                    f"  spilled {used.spilled if used.spilled is not None else '?':>5} B")
            if sass:
                ok &= used.loop is not None
                line += (f"  main loop {used.loop:>5,} per thread, {per_score(used.loop, tile):6.1f} per score"
                         if used.loop else "  main loop not found")
                if tile == COMPARED_TILE and used.loop:
                    compared[kind] = used.loop
            lines.append(line)
    if compared:
        tile = COMPARED_TILE
        lines.append(f"main loops at {tile[0]} x {tile[1]}, {tile[2]} warps: "
                     + " + ".join(f"{loop:,} ({kind})" for kind, loop in compared.items())
                     + f" = {sum(compared.values()):,} per thread per tile, "
                     f"{per_score(sum(compared.values()), tile):.1f} per score element")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.kernels.resources", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, choices=sorted(SHARED_MEMORY_PER_BLOCK), default=90,
                        help="compute capability as one number: 80 (A100), 86, 89, 90 (H100)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--head-dim", type=int, choices=(16, 32, 64, 128, 256), default=64)
    parser.add_argument("--padding", action="store_true", help="the kernels for batches with padding")
    parser.add_argument("--no-dropout", action="store_true", help="the kernels without attention dropout")
    parser.add_argument("--bias-gradient", choices=kernels.BIAS_GRADIENTS, default=kernels.BIAS_GRADIENT)
    parser.add_argument("--sass", action="store_true",
                        help="count each main loop's instructions (per thread, per score element)")
    parser.add_argument("--tile", action="store_true",
                        help=f"only the tile {COMPARED_TILE[:2]} with {COMPARED_TILE[2]} warps, not all of TILES")
    args = parser.parse_args(argv)
    problem = Problem(args.dtype, args.head_dim, True, args.padding, not args.no_dropout, args.bias_gradient)
    print(f"sm_{args.arch}, {problem}; shared memory per block at most {SHARED_MEMORY_PER_BLOCK[args.arch]:,} B")
    tiles = {kind: (COMPARED_TILE,) for kind in kernels.TILES} if args.tile else None
    lines, ok = report(args.arch, problem, tiles, args.sass)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
