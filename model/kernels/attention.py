"""Fused attention with COCO-LM's relative position bias and attention dropout, in Triton
(docs/design.md section 7.2).

    out = dropout(softmax(q k^T / sqrt(d) + bias[j - i] + padding)) v        (B, heads, T, d)

One flash-style kernel computes this without any (B, heads, T, T) tensor, forward or backward:

- **Inputs.** q, k, v (B, heads, T, d) in fp16, bf16 or fp32, last dimension contiguous (the encoder's
  q, k, v are views of one fused projection; they are read in place); the relative bias by distance,
  (heads, 2S + 1) fp32, entry clamp(j - i, -S, S) + S for query i and key j, gathered in torch from the
  bucket table (`RelativePositionBias.by_distance`) so that the table's gradient flows through torch:
  S is the distance from which the buckets saturate (86 at the paper's 32 buckets and 128 positions),
  so farther pairs share its entry; the
  real keys as a (B, T) bool mask (None: no padding); the dropout probability (applied at a resolution
  of 2^-16, `dropout_rate`); and a seed *tensor*
  (an int64 scalar on the device, drawn from torch's generator when not given), so a replayed CUDA
  graph draws a new mask on each replay and `torch.manual_seed` makes runs repeat.
- **Forward.** Per (batch, head) and block of queries, a loop over key blocks with the online
  softmax (exp2, fp32 statistics); the bias is read per element from the bias looked up in torch for
  every distance -(T - 1) .. T - 1, (heads, 2T - 1) (`every_distance`, once per encoder pass: no clamp per element);
  padding keys get -inf. Dropout multiplies the probabilities after the softmax's normaliser is taken
  (the normaliser sums the undropped probabilities). The mask is Philox (`tl.randint4x`, 10 rounds)
  on the seed, one call per 8 consecutive keys, its counter the flat index of the group's first
  element in (B, heads, T, T): its 4 x 32 bits are 8 uniforms of 16 bits, and a value is kept where
  its uniform is >= t = round(p 2^16), with probability exactly 1 - t / 2^16 (`dropout_rate`), and
  scaled by the reciprocal of that, so the expectation is kept exactly (torch's 1 / (1 - p) at p's
  multiple of 2^-16). The mask depends only on (batch, head, query, key), never on the tiling, and
  the backward regenerates it. The logsumexp per row (log2 units) is kept for the backward.
- **Backward.** dQ first, in one loop over query blocks (each program owns a query block and walks the
  key blocks: no atomics for dQ), which also writes delta = rowsum(dO * O) of its rows, (B, heads, T)
  fp32; then dK and dV in another (each program owns a key block and walks the query blocks), which
  read delta. Two launches, nothing computed in torch between them. The dK/dV loop computes
  each tile transposed, (keys, queries), S^T = K Q^T, so that P^T and dS^T enter dV += P^T dO and
  dK += dS^T Q as they come out, with one dropout mask per tile. The bias gradient is reduced inside
  each of its tiles along the diagonals (each (i, j) adds to entry clamp(j - i, -S, S) + S): the tile
  is rotated row by row with `tl.gather` so that column c holds the distances equal to c modulo M,
  and two masked column sums per block of rows give the M + N - 1 diagonal sums (`_add_by_distance`),
  added with `tl.atomic_add`s into a (heads, 2S + 1) fp32 buffer; a tile beyond S on one side adds its
  whole sum with one atomic (`BIAS_GRADIENT = "elementwise"`: one atomic per element, the simple
  reduction, kept to compare on a GPU).
- **Rows without a real key** (a row of padding only) give 0 and no gradient; SDPA and the
  reference give NaN there.

Wrapped as the custom op `cocolm::relative_attention` (with `register_fake` and `register_autograd`;
its backward is the op `cocolm::relative_attention_backward`), so it works under
`torch.compile(fullgraph=True)`; outside compilation the same bodies run through a plain autograd
Function (`_EagerRelativeAttention`), whose dispatch costs the host less. triton is an optional import: without it this module still imports
and the op raises, naming the cause. On CPU the kernels run under Triton's interpreter when
TRITON_INTERPRET=1 was set before triton was first imported (the CPU tests do that in a child
process); the interpreter is exact in fp32 and fp16, not in bf16 (triton-lang/triton#11584).

Each kernel is autotuned among a few tiles (`TILES`), the fastest of a wider set timed on an H100 (their
resources, compiled ahead of time for sm_90 without a GPU, are printed by `python -m model.kernels.resources`,
which also counts each main loop's instructions); the choice is kept on disk in Triton's cache.
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
    import triton.testing
except ImportError as error:  # the CPU wheel of torch does not bring triton; `import model` must still work
    triton = tl = None
    TRITON_MISSING: str | None = f"{type(error).__name__}: {error}"

    def _jit(fn):
        return fn  # never launched: every entry point checks TRITON_MISSING first
else:
    TRITON_MISSING = None
    _jit = triton.jit

# How the dK/dV loop reduces the bias gradient: "diagonal" (per tile along its diagonals, about M + N
# atomics per tile) or "elementwise" (one atomic per (query, key) element; simple, slow, correct).
BIAS_GRADIENTS = ("diagonal", "elementwise")
BIAS_GRADIENT = "diagonal"
BIAS_GRAD_CODES = {"none": 0, "diagonal": 1, "elementwise": 2}  # the dK/dV kernel's BIAS_GRAD, per reduction


# ----------------------------------------------------------------------------- Triton kernels

@_jit
def _dropout_threshold(dropout_p):
    """The integer t that a 16-bit uniform u must reach to be kept (u >= t), and the scale of a kept value,
    2^16 / (2^16 - t): the reciprocal of the keep probability (2^16 - t) / 2^16, so the expected output is
    unchanged. t is dropout_p * 2^16 rounded; `dropout_rate` gives the rate t / 2^16 that the kernels use."""
    threshold = tl.cast(dropout_p * 65536.0 + 0.5, tl.int32)
    return threshold, 65536.0 / tl.cast(65536 - threshold, tl.float32)


@_jit
def _keep(seed, bh, offs_m, start_n, T, threshold, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          KEYS_FIRST: tl.constexpr = False):
    """(BLOCK_M, BLOCK_N) bool for queries offs_m and keys start_n ... (transposed, (BLOCK_N, BLOCK_M),
    with KEYS_FIRST): which probabilities dropout keeps. One Philox call gives 4 x 32 bits, 8 uniforms
    of 16 bits: one call per 8 consecutive keys, its counter the flat index of the group's first element
    in (B, heads, T, T) (start_n is a multiple of 8). Key 8g + 2r + h of group g reads half h (0 the low 16
    bits, 1 the high) of the call's output r, and is kept where that half is >= threshold."""
    groups = start_n + 8 * tl.arange(0, BLOCK_N // 8)
    rows = bh.to(tl.int64) * T + offs_m
    if KEYS_FIRST:
        counter = rows[None, :] * T + groups[:, None]  # (BLOCK_N // 8, BLOCK_M)
    else:
        counter = rows[:, None] * T + groups[None, :]  # (BLOCK_M, BLOCK_N // 8)
    r0, r1, r2, r3 = tl.randint4x(seed, counter)
    # join stacks along a new last axis: (..., r // 2, r % 2, h), so the key's offset in its group is 2r + h
    keep = tl.join(tl.join(tl.join(r0 & 0xFFFF, r2 & 0xFFFF), tl.join(r1 & 0xFFFF, r3 & 0xFFFF)),
                   tl.join(tl.join(r0 >> 16, r2 >> 16), tl.join(r1 >> 16, r3 >> 16))) >= threshold
    if KEYS_FIRST:  # (groups, queries, r // 2, r % 2, h) -> (groups, r // 2, r % 2, h, queries)
        keep = tl.reshape(tl.permute(keep, (0, 2, 3, 4, 1)), (BLOCK_N, BLOCK_M))
    else:
        keep = tl.reshape(keep, (BLOCK_M, BLOCK_N))
    return keep


@_jit
def _key_ok(KEY_MASK_ROW, offs_n, T, HAS_MASK: tl.constexpr):
    """(BLOCK_N,) bool: keys inside the sequence and, with a mask, real."""
    ok = offs_n < T
    if HAS_MASK:
        ok = ok & (tl.load(KEY_MASK_ROW + offs_n, mask=offs_n < T, other=0) != 0)
    return ok


@_jit
def _entry(distance, S):
    """The entry of the bias by distance that a key-minus-query `distance` reads: distances are clamped to
    [-S, S], so a pair farther apart than S reads the last bucket's entry on its side."""
    return tl.minimum(tl.maximum(distance, -S), S) + S


@_jit
def _add_by_distance(DBIAS_ROW, lower, upper, distance, offset, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Atomically add a tile's diagonal sums into the bias gradient by distance: `lower` holds those of
    `distance` (key minus query: the tile's offset + c + b M) and `upper` those of distance - M;
    `offset` is the tile's first key minus its first query, its distances run from offset - (M - 1) to
    offset + N - 1 (lanes outside hold 0 and add nothing). A distance may have a part in both (when
    N > M): both add theirs. Distances beyond S on a side share the entry of -S or S: their sums are
    added up first and added once, by one lane of the nearest such distance, so a tile beyond S adds one
    value, not M + N - 1 to one address."""
    first, last = offset - (BLOCK_M - 1), offset + BLOCK_N - 1
    lower_ok = distance <= last
    upper_distance = distance - BLOCK_M
    upper_ok = upper_distance >= first
    lower_left, upper_left = distance <= -S, upper_distance <= -S
    lower_right = (distance >= S) & (distance > 0)  # with S = 0, distance 0 counts on the left only
    upper_right = (upper_distance >= S) & (upper_distance > 0)
    left_sum = tl.sum(tl.where(lower_left & lower_ok, lower, 0.0) + tl.where(upper_left & upper_ok, upper, 0.0), 0)
    right_sum = tl.sum(tl.where(lower_right & lower_ok, lower, 0.0) + tl.where(upper_right & upper_ok, upper, 0.0), 0)
    nearest_left = tl.minimum(-S, last)
    nearest_right = tl.maximum(tl.maximum(S, 1), first)
    # the nearest distance is in `lower` if it is >= offset, else only in `upper`
    once = tl.where(lower_right, distance == nearest_right, tl.where(lower_left, distance == nearest_left, True))
    tl.atomic_add(DBIAS_ROW + _entry(distance, S),
                  tl.where(lower_right, right_sum, tl.where(lower_left, left_sum, lower)),
                  mask=lower_ok & once, sem="relaxed")
    only_upper = upper_distance < offset
    once = tl.where(upper_right, (upper_distance == nearest_right) & only_upper,
                    tl.where(upper_left, (upper_distance == nearest_left) & only_upper, True))
    tl.atomic_add(DBIAS_ROW + _entry(upper_distance, S),
                  tl.where(upper_right, right_sum, tl.where(upper_left, left_sum, upper)),
                  mask=upper_ok & once, sem="relaxed")


@_jit
def _inside(offs, T):
    """Positions past the sequence moved to its last, for the bias lookup: their scores are masked or
    their rows discarded, but the address must stay inside the bias of every distance."""
    return tl.minimum(offs, T - 1)


@_jit
def _scores(a, b, BIAS_ROW, distance, ok, qk_scale, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """Logits in log2 units, (q k^T / sqrt(d) + bias[j - i]) * log2(e), of a b^T: q k^T for a tile of
    (query, key) pairs, k q^T for its transpose; `distance` j - i and `ok` (the key is real and inside
    the sequence, else -inf) in the same orientation. BIAS_ROW points at distance 0 of the bias of every
    distance (`every_distance`): no clamp per element."""
    s = tl.dot(a, tl.trans(b), input_precision=PRECISION) * qk_scale
    if HAS_BIAS:
        s += tl.load(BIAS_ROW + distance) * 1.4426950408889634
    return tl.where(ok, s, float("-inf"))


@_jit
def _batch_and_head(H):
    """This program's (batch x head) index, and its batch and head as int64 for the pointer offsets."""
    bh = tl.program_id(1)
    return bh, (bh // H).to(tl.int64), (bh % H).to(tl.int64)


@_jit
def _rows(BASE, b, h, stride_b, stride_h, stride_t, offs, offs_d):
    """Pointers to the rows `offs` of one (batch, head)'s (T, d) matrix, its last dimension contiguous."""
    return BASE + b * stride_b + h * stride_h + offs[:, None] * stride_t + offs_d[None, :]


@_jit
def _forward_kernel(
    Q, K, V, BIAS, KEY_MASK, SEED, OUT, LSE,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    stride_ob, stride_oh, stride_ot, stride_bias_h, stride_mask_b,
    H, T, sm_scale, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh, b, h = _batch_and_head(H)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < T
    d_ok = offs_d < HEAD_DIM
    q = tl.load(_rows(Q, b, h, stride_qb, stride_qh, stride_qt, offs_m, offs_d),
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    BIAS_ROW = BIAS + h * stride_bias_h + (T - 1)  # distance 0
    KEY_MASK_ROW = KEY_MASK + b * stride_mask_b
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if DROPOUT:
        seed = tl.load(SEED)
        threshold, keep_scale = _dropout_threshold(dropout_p)
    for start_n in range(0, T, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < T)[:, None] & d_ok[None, :]
        k = tl.load(_rows(K, b, h, stride_kb, stride_kh, stride_kt, offs_n, offs_d), mask=kv_mask, other=0.0)
        key_ok = _key_ok(KEY_MASK_ROW, offs_n, T, HAS_MASK)
        distance = _inside(offs_n, T)[None, :] - _inside(offs_m, T)[:, None]
        s = _scores(q, k, BIAS_ROW, distance, key_ok[None, :], qk_scale, HAS_BIAS, PRECISION)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no real key yet: keep exp2 finite
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)  # the normaliser sums the probabilities before dropout
        if DROPOUT:
            p = tl.where(_keep(seed, bh, offs_m, start_n, T, threshold, BLOCK_M, BLOCK_N), p * keep_scale, 0.0)
        v = tl.load(_rows(V, b, h, stride_vb, stride_vh, stride_vt, offs_n, offs_d), mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    has_key = l_i > 0
    l_i = tl.where(has_key, l_i, 1.0)
    out = acc / l_i[:, None]
    tl.store(_rows(OUT, b, h, stride_ob, stride_oh, stride_ot, offs_m, offs_d),
             out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    # log2 units; +inf on a row without a real key, so the backward's probabilities there are 0
    tl.store(LSE + bh.to(tl.int64) * T + offs_m, tl.where(has_key, m_i + tl.log2(l_i), float("inf")), mask=row_ok)


@_jit
def _backward_dkdv_kernel(
    Q, K, V, BIAS, KEY_MASK, SEED, DO, LSE, DELTA, DK, DV, DBIAS,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    stride_dob, stride_doh, stride_dot, stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
    stride_bias_h, stride_dbias_h, stride_mask_b,
    H, T, S, sm_scale, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, ROWS: tl.constexpr,
    HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
):
    """dK, dV of one key block, walking every query block; the bias gradient of each tile reduced
    along its diagonals (BIAS_GRAD 1) or element by element (2) into DBIAS with atomics (0: none)."""
    pid_n = tl.program_id(0)
    bh, b, h = _batch_and_head(H)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    kv_mask = (offs_n < T)[:, None] & d_ok[None, :]
    k = tl.load(_rows(K, b, h, stride_kb, stride_kh, stride_kt, offs_n, offs_d), mask=kv_mask, other=0.0)
    v = tl.load(_rows(V, b, h, stride_vb, stride_vh, stride_vt, offs_n, offs_d), mask=kv_mask, other=0.0)
    key_ok = _key_ok(KEY_MASK + b * stride_mask_b, offs_n, T, HAS_MASK)
    BIAS_ROW = BIAS + h * stride_bias_h + (T - 1)  # distance 0
    DBIAS_ROW = DBIAS + h * stride_dbias_h
    qk_scale = sm_scale * 1.4426950408889634
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    if DROPOUT:
        seed = tl.load(SEED)
        threshold, keep_scale = _dropout_threshold(dropout_p)
    if BIAS_GRAD == 1:
        # The diagonals of a transposed (key j, query i) tile, rotated into columns: entry (j, c) of the
        # rotated tile is dS^T[j, (j - c) mod M], at distance j - i = c + M floor((j - c) / M). In blocks of
        # ROWS = min(M, N) keys, the rows r >= c of block b hold distance c + b M, the rows r < c distance
        # c + (b - 1) M: two column sums per block give every diagonal's sum, each element read once.
        columns = tl.arange(0, BLOCK_M)
        rotation = (tl.arange(0, BLOCK_N)[:, None] - columns[None, :]) & (BLOCK_M - 1)
        lower_rows = tl.arange(0, ROWS)[None, :, None] >= columns[None, None, :]  # (1, ROWS, BLOCK_M)
        lower_distance = tl.reshape(tl.arange(0, BLOCK_N // ROWS)[:, None] * BLOCK_M + columns[None, :],
                                    (BLOCK_N // ROWS * BLOCK_M,))  # relative to the tile's offset
    # Every tile is computed transposed, (keys, queries), as S^T = K Q^T: P^T and dS^T are then the left
    # operands of dV += P^T dO and dK += dS^T Q as they come out of their products, with no transpose
    # of a computed tile (which goes through shared memory) and one dropout mask per tile.
    for start_m in range(0, T, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < T
        qd_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(_rows(Q, b, h, stride_qb, stride_qh, stride_qt, offs_m, offs_d), mask=qd_mask, other=0.0)
        do = tl.load(_rows(DO, b, h, stride_dob, stride_doh, stride_dot, offs_m, offs_d), mask=qd_mask, other=0.0)
        lse = tl.load(LSE + bh.to(tl.int64) * T + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + bh.to(tl.int64) * T + offs_m, mask=row_ok, other=0.0)
        distance = _inside(offs_n, T)[:, None] - _inside(offs_m, T)[None, :]
        s = _scores(k, q, BIAS_ROW, distance, key_ok[:, None], qk_scale, HAS_BIAS, PRECISION)  # (BLOCK_N, BLOCK_M)
        p = tl.exp2(s - lse[None, :])  # the softmax, transposed
        dp = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # dL/d(dropped probabilities), transposed
        if DROPOUT:  # the mask's one use (two made the compiler build it in two layouts)
            p_dropped = tl.where(_keep(seed, bh, offs_m, start_n, T, threshold, BLOCK_M, BLOCK_N, True),
                                 p * keep_scale, 0.0)
        else:
            p_dropped = p
        dv += tl.dot(p_dropped.to(do.dtype), do, input_precision=PRECISION)
        # dL/d(logits) = p (dropped(dp) - delta) = dropped(p) dp - p delta; queries past T or without a
        # real key have p = 0
        ds = p_dropped * dp - p * delta[None, :]
        dk += tl.dot(ds.to(q.dtype), q, input_precision=PRECISION)
        if BIAS_GRAD == 1:
            blocks = tl.reshape(tl.gather(ds, rotation, axis=1), (BLOCK_N // ROWS, ROWS, BLOCK_M))
            lower = tl.sum(tl.where(lower_rows, blocks, 0.0), axis=1)  # (BLOCK_N // ROWS, BLOCK_M)
            upper = tl.sum(blocks, axis=1) - lower
            _add_by_distance(DBIAS_ROW, tl.reshape(lower, (BLOCK_N // ROWS * BLOCK_M,)),
                             tl.reshape(upper, (BLOCK_N // ROWS * BLOCK_M,)), start_n - start_m + lower_distance,
                             start_n - start_m, S, BLOCK_M, BLOCK_N)
        if BIAS_GRAD == 2:
            tl.atomic_add(DBIAS_ROW + _entry(offs_n[:, None] - offs_m[None, :], S), ds, sem="relaxed")
    tl.store(_rows(DK, b, h, stride_dkb, stride_dkh, stride_dkt, offs_n, offs_d),
             (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(_rows(DV, b, h, stride_dvb, stride_dvh, stride_dvt, offs_n, offs_d),
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@_jit
def _backward_dq_kernel(
    Q, K, V, BIAS, KEY_MASK, SEED, DO, O, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    stride_dob, stride_doh, stride_dot, stride_ob, stride_oh, stride_ot, stride_dqb, stride_dqh, stride_dqt,
    stride_bias_h, stride_mask_b,
    H, T, sm_scale, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
):
    """dQ of one query block, walking every key block (each program writes only its own rows). It runs
    before the dK/dV kernel and computes delta = rowsum(dO * O) of its rows into DELTA for it: the rows
    are its own, so no other program writes them, and the backward needs no launch of its own for delta."""
    pid_m = tl.program_id(0)
    bh, b, h = _batch_and_head(H)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < T
    d_ok = offs_d < HEAD_DIM
    qd_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(_rows(Q, b, h, stride_qb, stride_qh, stride_qt, offs_m, offs_d), mask=qd_mask, other=0.0)
    do = tl.load(_rows(DO, b, h, stride_dob, stride_doh, stride_dot, offs_m, offs_d), mask=qd_mask, other=0.0)
    o = tl.load(_rows(O, b, h, stride_ob, stride_oh, stride_ot, offs_m, offs_d), mask=qd_mask, other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * T + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * T + offs_m, delta, mask=row_ok)
    BIAS_ROW = BIAS + h * stride_bias_h + (T - 1)  # distance 0
    KEY_MASK_ROW = KEY_MASK + b * stride_mask_b
    qk_scale = sm_scale * 1.4426950408889634
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if DROPOUT:
        seed = tl.load(SEED)
        threshold, keep_scale = _dropout_threshold(dropout_p)
    for start_n in range(0, T, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < T)[:, None] & d_ok[None, :]
        k = tl.load(_rows(K, b, h, stride_kb, stride_kh, stride_kt, offs_n, offs_d), mask=kv_mask, other=0.0)
        v = tl.load(_rows(V, b, h, stride_vb, stride_vh, stride_vt, offs_n, offs_d), mask=kv_mask, other=0.0)
        key_ok = _key_ok(KEY_MASK_ROW, offs_n, T, HAS_MASK)
        distance = _inside(offs_n, T)[None, :] - _inside(offs_m, T)[:, None]
        s = _scores(q, k, BIAS_ROW, distance, key_ok[None, :], qk_scale, HAS_BIAS, PRECISION)
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            dp = tl.where(_keep(seed, bh, offs_m, start_n, T, threshold, BLOCK_M, BLOCK_N), dp * keep_scale, 0.0)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(_rows(DQ, b, h, stride_dqb, stride_dqh, stride_dqt, offs_m, offs_d),
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=qd_mask)


@_jit
def _keep_mask_kernel(SEED, OUT, T, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The dropout mask of a (B, heads, T, T) problem, written out (debugging and tests only)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    bh = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = _keep(tl.load(SEED), bh, offs_m, pid_n * BLOCK_N, T, _dropout_threshold(dropout_p)[0], BLOCK_M, BLOCK_N)
    tl.store(OUT + (bh.to(tl.int64) * T + offs_m[:, None]) * T + offs_n[None, :], keep.to(tl.int8),
             mask=(offs_m < T)[:, None] & (offs_n < T)[None, :])


# ----------------------------------------------------------------------------- tiles

# The tiles each kernel's autotuning times on a GPU, as (query block, key block, warps, stages), at its first
# call per (T, head size, dtype, bias, padding, dropout; and the bias-gradient reduction for dK/dV). Each
# kernel's four fastest of 12-14 candidates, timed on an H100 (Triton 3.6, torch 2.11) at base: B 32, 12 heads,
# T 512, d 64, bf16, relative bias, dropout 0.1; every candidate agreed with the fp32 reference (relative
# error 2.3e-3) (docs/design.md 7.2, ms per launch). 64 x 64 with 4 warps and 2 stages, the probe's tile
# (`PROBE_BLOCKS`), stays first in every list, so tuning reuses the probe's binary; 8 warps lost everywhere.
TILES = {
    "forward": ((64, 64, 4, 2), (128, 64, 4, 2), (64, 32, 4, 3), (128, 32, 4, 2)),  # 0.373 0.311 0.320 0.349
    "dkdv": ((64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 2), (64, 128, 8, 2)),  # 0.608 0.631 0.698 0.727
    "dq": ((64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 1), (128, 64, 8, 2)),  # 0.334 0.337 0.348 0.381
}
# Under the interpreter (the CPU tests) two small tiles, so that the tests run the tuning path itself: the
# choice, and the bias gradient's buffer zeroed again after the timing runs added into it.
INTERPRETER_TILES = ((32, 32, 4, 2), (16, 32, 4, 2))
# What a tuned kernel's choice depends on, besides its tensors' dtypes (which the autotuner adds itself).
TUNING_KEY = ["T", "HEAD_DIM", "HAS_BIAS", "HAS_MASK", "DROPOUT"]


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (TRITON_INTERPRET=1 before triton's import)."""
    return INTERPRETED


# Decided once, at import: a constant to dynamo, which cannot trace isinstance on a Triton kernel.
INTERPRETED = TRITON_MISSING is None and not isinstance(_forward_kernel, triton.runtime.JITFunction)


def _rotated_rows(block_m: int, block_n: int) -> int:
    """The dK/dV kernel's ROWS: the keys in one block of its rotated tile (the bias gradient's diagonals)."""
    return min(block_m, block_n)


def problem_constants(head_dim: int, has_bias: bool, has_mask: bool, dropout: bool, precision: str) -> dict:
    """The constexpr arguments every kernel is specialised on besides its tiles (the dK/dV kernel adds
    its `BIAS_GRAD`); `model.kernels.resources` compiles with the same."""
    return dict(HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), HAS_BIAS=has_bias,
                HAS_MASK=has_mask, DROPOUT=dropout, PRECISION=precision)


def _launch_options(block_m: int, block_n: int) -> dict[str, int]:
    """Warps and stages for explicitly given tiles (tests, the debugging mask); tuned launches take theirs
    from `TILES`."""
    return {"num_warps": 4 if block_m * block_n <= 64 * 64 else 8, "num_stages": 2}


def _timing(kernel_call, quantiles):
    """The autotuner's clock: Triton's benchmark on a GPU; under the interpreter, which has no device to
    time, the wall clock of one call."""
    if interpreted():
        start = time.perf_counter()
        kernel_call()
        return [time.perf_counter() - start] * len(quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


def _tuned(kernel, tiles: tuple[tuple[int, int, int, int], ...], diagonals: bool = False, **autotune):
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, **({"ROWS": _rotated_rows(m, n)} if diagonals else {})},
                             num_warps=warps, num_stages=stages) for m, n, warps, stages in tiles]
    # cache_results: the timings go to Triton's cache directory (TRITON_CACHE_DIR, ~/.triton/cache), keyed by
    # the tuning key, the tiles, the kernel's source, Triton's version and the GPU: a second process, or
    # another rank on the machine once the first has tuned, reads the choice instead of timing again
    # (the interpreter never caches: Triton turns it off there).
    return triton.autotune(configs, do_bench=_timing, cache_results=True, **autotune)(kernel)


if TRITON_MISSING is None:
    _tiles = {kernel: INTERPRETER_TILES for kernel in TILES} if interpreted() else TILES
    _forward_tuned = _tuned(_forward_kernel, _tiles["forward"], key=TUNING_KEY)
    # The timing runs add into DBIAS: the autotuner zeroes it before each of them and before the real run.
    _dkdv_tuned = _tuned(_backward_dkdv_kernel, _tiles["dkdv"], diagonals=True, key=TUNING_KEY + ["BIAS_GRAD"],
                         reset_to_zero=["DBIAS"])
    _dq_tuned = _tuned(_backward_dq_kernel, _tiles["dq"], key=TUNING_KEY)
    # per kind of launch: (the tuned kernel, the kernel at explicit tiles)
    _KERNELS = {"forward": (_forward_tuned, _forward_kernel), "dkdv": (_dkdv_tuned, _backward_dkdv_kernel),
                "dq": (_dq_tuned, _backward_dq_kernel)}


def _kernel_at(tuned, kernel, block_m: int, block_n: int, diagonals: bool = False):
    """(kernel, its tile meta-parameters): the tuned kernel for blocks (0, 0), else `kernel` at these tiles."""
    if block_m == 0:
        return tuned, {}
    meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, **_launch_options(block_m, block_n)}
    return kernel, ({**meta, "ROWS": _rotated_rows(block_m, block_n)} if diagonals else meta)


def _check_runnable(device: torch.device) -> None:
    if TRITON_MISSING is not None:
        raise RuntimeError(f"the Triton attention kernel needs triton ({TRITON_MISSING})")
    if device.type != "cuda" and not interpreted():
        raise RuntimeError("the Triton attention kernel runs on CUDA devices, or on CPU under Triton's interpreter "
                           "(TRITON_INTERPRET=1 set before triton is first imported)")


def _precision(dtype: torch.dtype) -> str:
    """fp32 inputs get fp32 products ('ieee') unless torch allows TF32 matmuls; half types ignore it."""
    return "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _transposed_like(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """An empty (B, heads, T, d) tensor laid out as (B, T, heads, d) in memory: the encoder's next step,
    `transpose(1, 2).reshape(B, T, heads * d)`, is then a view, not a copy."""
    batch, heads, seq_len, dim = x.shape
    return x.new_empty((batch, seq_len, heads, dim), dtype=dtype).transpose(1, 2)


def _last_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _reach(bias: Tensor | None) -> int:
    """S of a (heads, 2S + 1) bias by distance: the distance from which it no longer changes."""
    return 0 if bias is None else (bias.shape[1] - 1) // 2


def every_distance(bias: Tensor, seq_len: int) -> Tensor:
    """(heads, 2T - 1) fp32, no gradient: the bias by distance (heads, 2S + 1) looked up for every distance
    -(T - 1) .. T - 1 (entry j - i + T - 1), what the kernels read, so that they never clamp a distance
    to [-S, S]. The encoder builds it once per pass for all its layers (`relative_attention`'s
    `every`); the bias's gradient comes from the kernels by distance, never through this lookup."""
    reach = _reach(bias)
    distances = torch.arange(-(seq_len - 1), seq_len, device=bias.device)
    return bias.detach().float()[:, distances.clamp(-reach, reach) + reach].contiguous()


def _optional_args(q: Tensor, bias: Tensor | None, key_mask: Tensor | None, seed: Tensor | None):
    """Pointers for the optional inputs (q stands in for an absent one: the kernel never reads it); `bias`
    is the bias of every distance (`every_distance`)."""
    bias_arg = q if bias is None else bias
    mask_arg = q if key_mask is None else key_mask.contiguous().view(torch.uint8)
    seed_arg = q if seed is None else seed
    strides = (0 if bias is None else bias.stride(0), 0 if key_mask is None else mask_arg.stride(0))
    return bias_arg, mask_arg, seed_arg, strides


@dataclass(frozen=True)
class Launch:
    """One kernel launch as the runtime makes it: which kernel (a key of `TILES`), its arguments in order,
    its constexprs besides the tiles, and the tile whose blocks the grid's first axis counts.
    `model.kernels.resources` compiles from the same, so that it sees what a GPU would run."""

    kind: str
    arguments: tuple
    constants: dict
    blocks_of: str  # "BLOCK_M" (one program per query block) or "BLOCK_N" (per key block)


def _forward_launch(q, k, v, every, key_mask, seed, dropout_p) -> tuple[Launch, Tensor, Tensor]:
    """The forward's launch, its output and its logsumexp (allocated, not yet written); `every` is the
    bias of every distance (`every_distance`) or None."""
    q, k, v = (_last_contiguous(x) for x in (q, k, v))
    batch, heads, seq_len, dim = q.shape
    out = _transposed_like(q)
    lse = torch.empty((batch, heads, seq_len), dtype=torch.float32, device=q.device)
    bias_arg, mask_arg, seed_arg, (stride_bias, stride_mask) = _optional_args(q, every, key_mask, seed)
    arguments = (q, k, v, bias_arg, mask_arg, seed_arg, out, lse,
                 *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], stride_bias, stride_mask,
                 heads, seq_len, 1.0 / math.sqrt(dim), float(dropout_p))
    constants = problem_constants(dim, every is not None, key_mask is not None, dropout_p > 0, _precision(q.dtype))
    return Launch("forward", arguments, constants, "BLOCK_M"), out, lse


def _backward_launches(dout, q, k, v, out, lse, bias, every, key_mask, seed, dropout_p, bias_gradient):
    """The backward's two launches, in order (dQ, which writes delta, then dK and dV, which read it), and
    the gradients they write: dq, dk, dv, dbias."""
    dout, q, k, v, out = (_last_contiguous(x) for x in (dout, q, k, v, out))
    batch, heads, seq_len, dim = q.shape
    delta = torch.empty((batch, heads, seq_len), dtype=torch.float32, device=q.device)  # written by dQ
    dq, dk, dv = _transposed_like(q), _transposed_like(k), _transposed_like(v)
    constants = problem_constants(dim, bias is not None, key_mask is not None, dropout_p > 0, _precision(q.dtype))
    learns_bias = bias is not None and bias_gradient != "none"
    # without a bias to learn, an empty buffer the kernel never touches (and tuning may zero)
    dbias = torch.zeros(bias.shape if learns_bias else (0,), dtype=torch.float32, device=q.device)
    bias_arg, mask_arg, seed_arg, (stride_bias, stride_mask) = _optional_args(q, every, key_mask, seed)
    sm_scale = 1.0 / math.sqrt(dim)
    dkdv = Launch("dkdv", (
        q, k, v, bias_arg, mask_arg, seed_arg, dout, lse, delta, dk, dv, dbias,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
        stride_bias, dbias.stride(0), stride_mask, heads, seq_len, _reach(bias), sm_scale, float(dropout_p),
    ), {**constants, "BIAS_GRAD": BIAS_GRAD_CODES[bias_gradient if learns_bias else "none"]}, "BLOCK_N")
    dq_launch = Launch("dq", (
        q, k, v, bias_arg, mask_arg, seed_arg, dout, out, lse, delta, dq,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *out.stride()[:3],
        *dq.stride()[:3], stride_bias, stride_mask, heads, seq_len, sm_scale, float(dropout_p),
    ), constants, "BLOCK_M")
    return (dq_launch, dkdv), (dq, dk, dv, dbias)


def _run(launch: Launch, block_m: int, block_n: int) -> None:
    """Launches at the given tiles, or (0, 0) at the tuned ones, over (blocks, B x heads)."""
    q = launch.arguments[0]
    batch, heads, seq_len, _ = q.shape
    tuned, kernel = _KERNELS[launch.kind]
    kernel, tiles = _kernel_at(tuned, kernel, block_m, block_n, diagonals=launch.kind == "dkdv")
    kernel[lambda meta: (triton.cdiv(seq_len, meta[launch.blocks_of]), batch * heads)](
        *launch.arguments, **launch.constants, **tiles)


def _forward(q, k, v, every, key_mask, seed, dropout_p, block_m, block_n) -> tuple[Tensor, Tensor]:
    _check_runnable(q.device)
    launch, out, lse = _forward_launch(q, k, v, every, key_mask, seed, dropout_p)
    _run(launch, block_m, block_n)
    return out, lse


def _backward(dout, q, k, v, out, lse, bias, every, key_mask, seed, dropout_p, block_m, block_n, bias_gradient):
    _check_runnable(q.device)
    launches, gradients = _backward_launches(dout, q, k, v, out, lse, bias, every, key_mask, seed, dropout_p,
                                             bias_gradient)
    for launch in launches:
        _run(launch, block_m, block_n)
    return gradients


# ----------------------------------------------------------------------------- the custom ops

@torch.library.custom_op("cocolm::relative_attention", mutates_args=())
def relative_attention_op(
    q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], every: Optional[Tensor], key_mask: Optional[Tensor],
    seed: Optional[Tensor], dropout_p: float, block_m: int, block_n: int,
) -> tuple[Tensor, Tensor]:
    """(out (B, heads, T, d), logsumexp per row (B, heads, T) fp32 in log2 units); see `relative_attention`.
    `bias` (heads, 2S + 1) is what gets the gradient; the kernels read `every`, its lookup for every
    distance. block_m = block_n = 0: each kernel runs at its tuned tiles (`TILES`)."""
    return _forward(q, k, v, every, key_mask, seed, dropout_p, block_m, block_n)


@relative_attention_op.register_fake
def _(q, k, v, bias, every, key_mask, seed, dropout_p, block_m, block_n):
    batch, heads, seq_len, _ = q.shape
    return _transposed_like(q), q.new_empty((batch, heads, seq_len), dtype=torch.float32)


@torch.library.custom_op("cocolm::relative_attention_backward", mutates_args=())
def relative_attention_backward_op(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
    every: Optional[Tensor], key_mask: Optional[Tensor], seed: Optional[Tensor], dropout_p: float, block_m: int,
    block_n: int, bias_gradient: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dbias); dbias is (heads, 2S + 1) fp32 like the bias, or empty when there is no bias to learn."""
    return _backward(dout, q, k, v, out, lse, bias, every, key_mask, seed, dropout_p, block_m, block_n,
                     bias_gradient)


@relative_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, bias, every, key_mask, seed, dropout_p, block_m, block_n, bias_gradient):
    learns_bias = bias is not None and bias_gradient != "none"
    dbias = (q.new_empty(bias.shape, dtype=torch.float32) if learns_bias
             else q.new_empty((0,), dtype=torch.float32))
    return _transposed_like(q), _transposed_like(k), _transposed_like(v), dbias


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, bias, every, key_mask, seed, dropout_p, block_m, block_n = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, bias, every, key_mask, seed)
    ctx.set_materialize_grads(False)  # the logsumexp gets no gradient: no zeros made for it per call
    ctx.dropout_p, ctx.block_m, ctx.block_n = dropout_p, block_m, block_n


def _gradients(ctx, dout, backward) -> tuple:
    """The inputs' gradients from the output's, `backward` being the backward op (compiled) or its body
    (eager); None for all where the output took no part in the loss (grads are not materialised)."""
    if dout is None:
        return (None,) * 10
    q, k, v, out, lse, bias, every, key_mask, seed = ctx.saved_tensors
    bias_gradient = BIAS_GRADIENT if bias is not None and ctx.needs_input_grad[3] else "none"
    dq, dk, dv, dbias = backward(dout, q, k, v, out, lse, bias, every, key_mask, seed, ctx.dropout_p, ctx.block_m,
                                 ctx.block_n, bias_gradient)
    return dq, dk, dv, (dbias if bias_gradient != "none" else None), None, None, None, None, None, None


def _backward_formula(ctx, dout, dlse):
    return _gradients(ctx, dout, relative_attention_backward_op)


class _EagerRelativeAttention(torch.autograd.Function):
    """What `relative_attention` runs outside torch.compile: the custom ops' bodies, called directly.
    A custom op's dispatch (its wrappers, schema defaults, aliasing checks, and autograd through
    `register_autograd`) costs the host more than the three kernel launches themselves: in a profile on
    an H200, 0.65 ms of each call's host time was the ops' own wrapper (docs/design.md 7.2), while a
    call is host-bound. Compiled, the custom ops stay what dynamo and inductor see."""

    @staticmethod
    def forward(ctx, q, k, v, bias, every, key_mask, seed, dropout_p, block_m, block_n):
        out, lse = _forward(q, k, v, every, key_mask, seed, dropout_p, block_m, block_n)
        _setup_context(ctx, (q, k, v, bias, every, key_mask, seed, dropout_p, block_m, block_n), (out, lse))
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        return _gradients(ctx, dout, _backward)


relative_attention_op.register_autograd(_backward_formula, setup_context=_setup_context)


# ----------------------------------------------------------------------------- the entry points

def dropout_rate(dropout_p: float) -> float:
    """The rate the kernels drop at for `dropout_p`: t / 2^16, t = dropout_p * 2^16 rounded (p in fp32, as
    the kernels receive it). A value is kept where its 16-bit uniform is >= t, with probability exactly
    1 - t / 2^16, and scaled by the reciprocal of that (`_dropout_threshold`): at p = 0.1, t = 6,554, the
    keep probability 58,982 / 65,536 = 0.899993896484375."""
    as_fp32 = struct.unpack("f", struct.pack("f", dropout_p))[0]
    return math.floor(as_fp32 * 65536.0 + 0.5) / 65536.0



def relative_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, key_mask: Tensor | None = None,
    dropout_p: float = 0.0, seed: Tensor | None = None, blocks: tuple[int, int] | None = None,
    every: Tensor | None = None,
) -> Tensor:
    """dropout(softmax(q k^T / sqrt(d) + bias[:, clamp(j - i, -S, S) + S] + padding)) v, fused; (B, heads, T, d).

    `bias` (heads, 2S + 1), fp32 (cast if not), gets a gradient: the bias of each key-minus-query
    distance -S .. S at entry distance + S; a pair farther apart than S reads the entry of -S or S (the
    last buckets: `RelativePositionBias.by_distance` gives the S from which they saturate; a bias of
    every distance is S = T - 1). `key_mask` (B, T) bool, True on real keys, None for none padded;
    `dropout_p` is applied at the kernels' resolution, `dropout_rate(dropout_p)` (a multiple of 2^-16),
    kept values scaled by 1 / (1 - that); `seed` an int64 scalar tensor on q's device (drawn from
    torch's generator when None and dropout is on); `blocks` (query block, key block), powers of two
    >= 16, for all three kernels, or None: each kernel autotuned among its `TILES` at its first call per
    problem kind (under the interpreter, among `INTERPRETER_TILES`); `every` the bias's lookup for every
    distance, `every_distance(bias, T)`, which an encoder builds once for all its layers (built here per
    call when None). The output is laid out as (B, T, heads, d) in memory.
    """
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share one (B, heads, T, d) shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v must share one of fp16, bf16, fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    batch, heads, seq_len, dim = q.shape
    if dim > 256:
        raise ValueError(f"head size {dim} is above the kernel's 256")
    if bias is not None:
        if bias.dim() != 2 or bias.shape[0] != heads or bias.shape[1] % 2 == 0:
            raise ValueError(f"bias must be (heads, 2S + 1) = ({heads}, odd), got {tuple(bias.shape)}")
        bias = _last_contiguous(bias.float())
        every = every_distance(bias, seq_len) if every is None else every
        if tuple(every.shape) != (heads, 2 * seq_len - 1) or every.dtype != torch.float32:
            raise ValueError(f"every must be fp32 ({heads}, {2 * seq_len - 1}), every_distance(bias, T), "
                             f"got {every.dtype} {tuple(every.shape)}")
    else:
        every = None
    if key_mask is not None:
        if tuple(key_mask.shape) != (batch, seq_len) or key_mask.dtype != torch.bool:
            raise ValueError(f"key_mask must be bool ({batch}, {seq_len}), "
                             f"got {key_mask.dtype} {tuple(key_mask.shape)}")
    dropout_p = dropout_rate(dropout_p)
    if dropout_p >= 1.0:
        raise ValueError("dropout_p rounds to 1 at the kernels' resolution of 2^-16")
    if dropout_p > 0:
        if seed is None:
            seed = torch.randint(0, 2**62, (), device=q.device, dtype=torch.int64)
        elif seed.dtype != torch.int64 or seed.numel() != 1:
            raise ValueError(f"seed must be one int64 element, got {seed.dtype} with {seed.numel()} elements")
    else:
        seed = None
    block_m, block_n = blocks or (0, 0)
    if blocks is not None:
        check_blocks(blocks, q.dtype, dropout_p > 0, compiled=not interpreted())
    arguments = (q, k, v, bias, every, key_mask, seed, float(dropout_p), block_m, block_n)
    if torch.compiler.is_compiling():
        return relative_attention_op(*arguments)[0]
    return _EagerRelativeAttention.apply(*arguments)


def check_blocks(blocks: tuple[int, int], dtype: torch.dtype, dropout: bool, compiled: bool) -> None:
    """Explicit tiles the kernels run correctly at, else a ValueError naming why: powers of two >= 16; and,
    compiled for a GPU with dropout in fp16 or bf16, no tile of 16 x 16, 16 x 32 or 32 x 16. There Triton
    3.6 (torch 2.11's, on an H100) miscompiles the dropout mask (`_keep`'s joins and reshape into the
    tensor-core layout): outputs and gradients off by a relative 0.8-1.8 in the forward, dK/dV or dQ,
    while fp32, no dropout, and every tile with a side of 64 or both of 32 agree with the reference
    (docs/design.md 7.2). The interpreter computes them right; `TILES` and `PROBE_BLOCKS` avoid them."""
    if any(block < 16 or block & (block - 1) for block in blocks):
        raise ValueError(f"blocks must be powers of two >= 16, got {blocks}")
    if compiled and dropout and dtype != torch.float32 and max(blocks) < 64 and min(blocks) < 32:
        raise ValueError(f"blocks {blocks} give wrong results with dropout in {str(dtype).removeprefix('torch.')} "
                         "on a GPU (Triton miscompiles the dropout mask at tiles of 16 x 16, 16 x 32 and "
                         "32 x 16): use 32 x 32 or larger")


def dropout_keep_mask(
    seed: Tensor, batch: int, heads: int, seq_len: int, dropout_p: float, blocks: tuple[int, int] | None = None,
) -> Tensor:
    """(B, heads, T, T) bool: the probabilities the kernels keep for this seed (debugging and tests; it
    materialises what the kernels never do). Kept values are scaled by 1 / (1 - dropout_rate(dropout_p)).
    The mask does not depend on the tiles; `blocks` only shows that."""
    _check_runnable(seed.device)
    block_m, block_n = blocks or (32, 32)
    keep = torch.empty((batch, heads, seq_len, seq_len), dtype=torch.int8, device=seed.device)
    grid = (triton.cdiv(seq_len, block_m), triton.cdiv(seq_len, block_n), batch * heads)
    _keep_mask_kernel[grid](seed, keep, seq_len, dropout_rate(dropout_p), BLOCK_M=block_m, BLOCK_N=block_n)
    return keep.bool()
