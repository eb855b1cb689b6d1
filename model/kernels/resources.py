"""The attention kernels compiled ahead of time for a GPU that is not here, and what each one needs there.

Triton compiles for any NVIDIA architecture without a device (its wheel ships ptxas and cuobjdump), so a
CPU machine can show that every kernel, at every tile its autotuning may pick (`TILES`), compiles for the
GPU, and what it takes there per block of threads: shared memory (against the architecture's limit),
registers per thread, and local memory per thread (registers spilled to memory: slower, never wrong).

    python -m model.kernels.resources                     # sm_90 (H100), bf16, head size 64, bias, dropout
    python -m model.kernels.resources --arch 80 --dtype fp16 --head-dim 128 --padding --no-dropout

It exits with 1 if a tile fails to compile or needs more shared memory than the architecture has. The
tiles in `TILES` were chosen with it; which of them is fastest only a GPU can say (docs/design.md 7.2).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from model.kernels import attention as kernels

if kernels.TRITON_MISSING is None:  # else `kernel_functions` says what is missing
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

# Shared memory one block may use, in bytes (the CUDA C++ Programming Guide's compute capability table,
# with the opt-in maximum): A100, RTX 30xx, RTX 40xx / L4 / L40, H100 / H200.
SHARED_MEMORY_PER_BLOCK = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


@dataclass(frozen=True)
class Problem:
    """What a kernel is compiled for, besides its tiles: the constexpr flags it is specialised on."""

    dtype: str = "bf16"
    head_dim: int = 64
    bias: bool = True
    padding: bool = False
    dropout: bool = True
    bias_gradient: str = "diagonal"


@dataclass(frozen=True)
class Resources:
    shared: int  # bytes per block
    registers: int | None  # per thread; None where cuobjdump could not read the binary
    spilled: int | None  # bytes of local memory per thread


def kernel_functions() -> dict:
    if kernels.TRITON_MISSING is not None:
        raise RuntimeError(f"compiling the kernels needs triton ({kernels.TRITON_MISSING})")
    if kernels.interpreted():
        raise RuntimeError("TRITON_INTERPRET=1 is set: the kernels are interpreted here, not compiled")
    return {"forward": kernels._forward_kernel, "dkdv": kernels._backward_dkdv_kernel,
            "dq": kernels._backward_dq_kernel}


def constants(kind: str, problem: Problem, tile: tuple[int, int, int, int]) -> dict:
    """The constexpr arguments, as `model.kernels.attention` passes them at this tile."""
    block_m, block_n = tile[:2]
    values = dict(kernels.problem_constants(problem.head_dim, problem.bias, problem.padding, problem.dropout, "ieee"),
                  BLOCK_M=block_m, BLOCK_N=block_n)
    if kind == "dkdv":
        values.update(BIAS_GRAD=kernels.BIAS_GRAD_CODES[problem.bias_gradient if problem.bias else "none"],
                      DIAGONALS=kernels._diagonals(block_m, block_n))
    return values


def signature(function, dtype: str, constexprs: dict) -> dict[str, str]:
    """Each argument's Triton type, by the kernels' naming: upper case are pointers (q, k, v, the output
    and their gradients in the problem's dtype; the bias, statistics and bias gradient fp32; the padding
    mask bytes; the seed int64), `stride_*`, H, T and S are int32 and the two scales fp32."""
    pointers = {"BIAS": "*fp32", "LSE": "*fp32", "DELTA": "*fp32", "DBIAS": "*fp32", "KEY_MASK": "*u8",
                "SEED": "*i64", **{name: f"*{dtype}" for name in ("Q", "K", "V", "OUT", "DO", "DQ", "DK", "DV")}}
    types = {}
    for name in function.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name in pointers:
            types[name] = pointers[name]
        elif name in ("sm_scale", "dropout_p"):
            types[name] = "fp32"
        elif name.startswith("stride_") or name in ("H", "T", "S"):
            types[name] = "i32"
        else:
            raise ValueError(f"{function.__name__}: no type for argument {name!r}")
    return types


def compile_for(arch: int, kind: str, problem: Problem, tile: tuple[int, int, int, int]):
    """The kernel compiled for sm_{arch} at `tile` (query block, key block, warps, stages), no GPU needed."""
    function = kernel_functions()[kind]
    constexprs = constants(kind, problem, tile)
    source = ASTSource(fn=function, signature=signature(function, DTYPES[problem.dtype], constexprs),
                       constexprs=constexprs)
    return kernels.triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": tile[2], "num_stages": tile[3]})


def resources(compiled) -> Resources:
    """Shared memory from Triton's metadata; registers and local memory from the binary (cuobjdump)."""
    tool = os.path.join(os.path.dirname(kernels.triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    registers = spilled = None
    if os.path.exists(tool):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as binary:
            binary.write(compiled.asm["cubin"])
            binary.flush()
            usage = subprocess.run([tool, "--dump-resource-usage", binary.name], capture_output=True, text=True).stdout
        found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        if found:
            registers, spilled = int(found.group(1)), int(found.group(2))
    return Resources(compiled.metadata.shared, registers, spilled)


def report(arch: int, problem: Problem, tiles: dict | None = None) -> tuple[list[str], bool]:
    """One line per kernel and tile, and whether every one compiled and fits the shared memory."""
    limit = SHARED_MEMORY_PER_BLOCK[arch]
    lines, ok = [], True
    for kind, candidates in (tiles or kernels.TILES).items():
        for tile in candidates:
            name = f"{kind:8} {tile[0]:>3} x {tile[1]:<3} {tile[2]} warps {tile[3]} stages"
            try:
                used = resources(compile_for(arch, kind, problem, tile))
            except Exception as error:  # a compile failure is what this reports
                lines.append(f"{name}  FAILED: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                ok = False
                continue
            fits = used.shared <= limit
            ok &= fits
            lines.append(f"{name}  shared {used.shared:>7,} B{'' if fits else ' > ' + format(limit, ',')}"
                         f"  registers {used.registers if used.registers is not None else '?':>3}"
                         f"  spilled {used.spilled if used.spilled is not None else '?':>5} B")
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
    args = parser.parse_args(argv)
    problem = Problem(args.dtype, args.head_dim, True, args.padding, not args.no_dropout, args.bias_gradient)
    print(f"sm_{args.arch}, {problem}; shared memory per block at most {SHARED_MEMORY_PER_BLOCK[args.arch]:,} B")
    lines, ok = report(args.arch, problem)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
