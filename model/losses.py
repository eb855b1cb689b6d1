"""COCO-LM's loss parts as pure functions (docs/method.md section 4). The tests recompute each one independently."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

# (local vectors (n, H)) -> (vectors of every worker (n * world, H), index of the local slice's first row)
Gather = Callable[[torch.Tensor], tuple[torch.Tensor, int]]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is True (NaN where it is all False), as sums: selecting with the
    mask (values[mask]) would make the host wait for the device to learn the selection's size."""
    mask = mask.float()
    return (values.float() * mask).sum() / mask.sum()


IGNORE_INDEX = -100  # F.cross_entropy's default


def valid_mean(values: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of `values` (N,) over the slots where `valid` is True; all of them when `valid` is None.

    `valid` marks the real slots of a fixed-shape step's padded position index (`model.objective.
    to_device`). The padded slots are selected away rather than multiplied by 0, so they add nothing to
    the mean and pass back a zero gradient even where their value is inf."""
    if valid is None:
        return values.mean()
    return torch.where(valid, values, 0.0).sum() / valid.sum()


def mlm_loss(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy at the masked positions. (N, V), (N,) -> (); `valid` (N,) as in `valid_mean`:
    the padded slots are cross-entropy's ignored targets, so the mean is over the real ones."""
    if valid is not None:
        targets = torch.where(valid, targets, IGNORE_INDEX)
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)


def copy_loss(copy_logits: torch.Tensor, is_original: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """L_copy: BCE with target 1 where x_mlm == x_orig, 0 where replaced, mean over real positions. (B, T) -> ()"""
    per_position = F.binary_cross_entropy_with_logits(copy_logits.float(), is_original.float(), reduction="none")
    return masked_mean(per_position, attention_mask)


def lm_log_probs(
    lm_logits: torch.Tensor,  # (N, V) at the LM positions
    copy_logits: torch.Tensor,  # (N,) copy head logits at the same positions
    corrupted: torch.Tensor,  # (N,) x_mlm at those positions
    copy_mixture: bool = True,
    stop_gradient: bool = True,
) -> torch.Tensor:
    """log p_LM(v) for every v, (N, V):
    p_LM(v) = 1[v == x_mlm] * sg(p_copy(1|h)) + sg(p_copy(0|h)) * softmax(lm_logits)[v], in log space.

    The whole distribution, for analysis and as the reference `lm_predictions` is tested against; the
    training step itself needs only the target's entry (`lm_loss`) and the argmax (`lm_predictions`)."""
    log_softmax = torch.log_softmax(lm_logits.float(), dim=-1)
    if not copy_mixture:  # clm_no_copy: a plain softmax
        return log_softmax
    c = copy_logits.float().detach() if stop_gradient else copy_logits.float()
    generate = F.logsigmoid(-c)[:, None] + log_softmax  # log p_copy(0) + log softmax(v)
    copy = torch.full_like(generate, float("-inf")).scatter(1, corrupted[:, None], F.logsigmoid(c)[:, None])
    return torch.logaddexp(generate, copy)


@torch.no_grad()
def lm_predictions(
    lm_logits: torch.Tensor,  # (N, V)
    copy_logits: torch.Tensor,  # (N,)
    corrupted: torch.Tensor,  # (N,) x_mlm
    copy_mixture: bool = True,
) -> torch.Tensor:
    """argmax_v p_LM(v), (N,), without building the (N, V) mixture of `lm_log_probs`.

    The copy branch only lifts x_mlm, so the mixture's argmax is either the softmax's argmax or x_mlm:
    x_mlm wins when p_copy(1) + p_copy(0) softmax[x_mlm] >= p_copy(0) max softmax.
    """
    top = lm_logits.argmax(-1)
    if not copy_mixture:
        return top
    logits, c = lm_logits.float(), copy_logits.float()
    log_norm = torch.logsumexp(logits, dim=-1)  # (N,)
    log_generate = F.logsigmoid(-c)
    top_score = log_generate + logits.gather(1, top[:, None]).squeeze(1) - log_norm
    copy_score = torch.logaddexp(F.logsigmoid(c), log_generate + logits.gather(1, corrupted[:, None]).squeeze(1) - log_norm)
    return torch.where(copy_score >= top_score, corrupted, top)


def lm_loss(
    lm_logits: torch.Tensor,  # (N, V)
    copy_logits: torch.Tensor,  # (N,)
    corrupted: torch.Tensor,  # (N,) x_mlm
    targets: torch.Tensor,  # (N,) x_orig
    copy_mixture: bool = True,
    stop_gradient: bool = True,
    valid: torch.Tensor | None = None,  # (N,) bool: the real slots of a padded index (`valid_mean`)
) -> torch.Tensor:
    """L_LM = mean of -log p_LM(x_orig) over the LM positions, through the copy mixture in log space.

    Only the target's entry is needed, so this avoids the (N, V) mixture that `lm_log_probs` builds.
    """
    log_softmax = torch.log_softmax(lm_logits.float(), dim=-1)
    log_target = log_softmax.gather(1, targets[:, None]).squeeze(1)  # (N,)
    if not copy_mixture:
        return -valid_mean(log_target, valid)
    c = copy_logits.float().detach() if stop_gradient else copy_logits.float()
    generate = F.logsigmoid(-c) + log_target
    # Where the input already holds the original token, the copy branch adds p_copy(1).
    log_p = torch.where(corrupted == targets, torch.logaddexp(F.logsigmoid(c), generate), generate)
    return -valid_mean(log_p, valid)


def all_gather_with_grad(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every data-parallel worker's rows; gradients flow through the local slice only."""
    world, rank = dist.get_world_size(), dist.get_rank()
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x.detach().contiguous())
    gathered[rank] = x
    return torch.cat(gathered), rank * x.shape[0]


def scl_logits(
    s_a: torch.Tensor, s_b: torch.Tensor, temperature: float = 1.0, gather: Gather | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarities / tau of the 2n local views against all views, self excluded, and each view's positive.

    Returns (logits (2n, 2m) with -inf on self, positive index (2n,)), m = n * world (n without gather).
    """
    a, b = F.normalize(s_a.float(), dim=-1), F.normalize(s_b.float(), dim=-1)  # (n, H)
    n = a.shape[0]
    a_all, offset = gather(a) if gather else (a, 0)
    b_all, _ = gather(b) if gather else (b, 0)
    m = a_all.shape[0]
    queries = torch.cat([a, b])  # (2n, H): local views
    keys = torch.cat([a_all, b_all])  # (2m, H)
    logits = queries @ keys.T / temperature  # (2n, 2m)
    local = torch.arange(n, device=a.device) + offset
    self_index = torch.cat([local, local + m])
    positive = torch.cat([local + m, local])  # a_i's partner is b_i and vice versa
    logits = logits.index_put((torch.arange(2 * n, device=a.device), self_index), logits.new_full((), float("-inf")))
    return logits, positive


def scl_loss(s_a: torch.Tensor, s_b: torch.Tensor, temperature: float = 1.0, gather: Gather | None = None) -> torch.Tensor:
    """Symmetric contrastive loss: each of the 2n views against its partner and 2m - 2 negatives."""
    logits, positive = scl_logits(s_a, s_b, temperature, gather)
    return F.cross_entropy(logits, positive)


def scl_cosines(s_a: torch.Tensor, s_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cosine of positive pairs and of negative pairs (the 2n - 2 others), local views only (Fig. 7a/b)."""
    z = F.normalize(torch.cat([s_a, s_b]).float(), dim=-1)  # (2n, H)
    n = s_a.shape[0]
    cos = z @ z.T  # (2n, 2n)
    positive = torch.arange(2 * n, device=z.device).roll(n)  # i's partner is i + n (mod 2n)
    # itself and its partner (the identity rolled by n columns) are not negatives; built without an
    # indexed assignment, which makes the host wait for a CUDA device (found on an H100)
    itself = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    is_negative = ~(itself | itself.roll(n, dims=1))
    return cos.gather(1, positive[:, None]).mean(), masked_mean(cos, is_negative)
