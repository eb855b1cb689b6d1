"""Each loss part against an independent float64 computation of the paper's formula (docs/method.md section 4)."""

import math

import pytest
import torch

from model import losses


def sigmoid64(x):
    return 1.0 / (1.0 + torch.exp(-x.double()))


def test_copy_loss_is_bce_over_real_positions():
    torch.manual_seed(0)
    logits = torch.randn(3, 7)
    original = torch.rand(3, 7) > 0.3
    real = torch.ones(3, 7, dtype=torch.bool)
    real[2, 4:] = False
    p = sigmoid64(logits)
    t = original.double()
    per_position = -(t * torch.log(p) + (1 - t) * torch.log(1 - p))
    expected = per_position[real].sum() / real.sum()
    torch.testing.assert_close(losses.copy_loss(logits, original, real).double(), expected)


def lm_loss_by_hand(lm_logits, copy_logits, corrupted, targets):
    """-log(1[x_mlm == x_orig] p_copy(1) + p_copy(0) softmax[x_orig]) with probabilities, in float64."""
    p1 = sigmoid64(copy_logits)
    soft = torch.softmax(lm_logits.double(), -1).gather(1, targets[:, None]).squeeze(1)
    p = (corrupted == targets).double() * p1 + (1 - p1) * soft
    return -torch.log(p).mean()


def test_lm_loss_with_copy_mixture():
    torch.manual_seed(1)
    n, v = 12, 9
    lm_logits, copy_logits = torch.randn(n, v), torch.randn(n)
    targets = torch.randint(0, v, (n,))
    corrupted = torch.where(torch.arange(n) % 3 == 0, targets, (targets + 1) % v)  # a third left original
    ours = losses.lm_loss(lm_logits, copy_logits, corrupted, targets)
    torch.testing.assert_close(ours.double(), lm_loss_by_hand(lm_logits, copy_logits, corrupted, targets))


def test_lm_loss_is_computed_in_log_space():
    # The target's softmax probability is e^-200: 0 in float32 probabilities, finite in log space.
    lm_logits = torch.tensor([[0.0, 200.0]])
    copy_logits = torch.tensor([0.0])
    targets, corrupted = torch.tensor([0]), torch.tensor([1])
    ours = losses.lm_loss(lm_logits, copy_logits, corrupted, targets)
    naive = -torch.log(torch.softmax(lm_logits, -1)[0, 0] * 0.5)  # float32 probabilities: inf
    assert torch.isinf(naive)
    expected = math.log(2) + 200 + math.log1p(math.exp(-200))  # -log(0.5 * e^-200 / (1 + e^-200))
    assert torch.isfinite(ours) and abs(ours.item() - expected) < 1e-3


def test_lm_log_probs_is_the_mixture_distribution():
    torch.manual_seed(2)
    n, v = 5, 6
    lm_logits, copy_logits = torch.randn(n, v), torch.randn(n)
    corrupted = torch.randint(0, v, (n,))
    probs = losses.lm_log_probs(lm_logits, copy_logits, corrupted).exp().double()
    p1 = sigmoid64(copy_logits)
    expected = (1 - p1)[:, None] * torch.softmax(lm_logits.double(), -1)
    expected[torch.arange(n), corrupted] += p1
    torch.testing.assert_close(probs, expected)
    torch.testing.assert_close(probs.sum(-1), torch.ones(n, dtype=torch.float64))


@pytest.mark.parametrize("copy_mixture", [True, False])
def test_lm_predictions_are_the_argmax_of_the_mixture(copy_mixture):
    torch.manual_seed(7)
    n, v = 400, 7
    lm_logits, copy_logits = 2 * torch.randn(n, v), 2 * torch.randn(n)
    corrupted = torch.randint(0, v, (n,))
    expected = losses.lm_log_probs(lm_logits, copy_logits, corrupted, copy_mixture).argmax(-1)
    ours = losses.lm_predictions(lm_logits, copy_logits, corrupted, copy_mixture)
    assert torch.equal(ours, expected)
    assert copy_mixture is False or (ours == corrupted).any() and (ours != corrupted).any()  # both branches seen


def test_lm_loss_gives_the_copy_head_exactly_zero_gradient():
    torch.manual_seed(3)
    lm_logits = torch.randn(8, 5, requires_grad=True)
    copy_logits = torch.randn(8, requires_grad=True)
    targets = torch.randint(0, 5, (8,))
    corrupted = torch.where(torch.arange(8) < 4, targets, (targets + 2) % 5)
    losses.lm_loss(lm_logits, copy_logits, corrupted, targets).backward()
    assert copy_logits.grad is None or torch.count_nonzero(copy_logits.grad) == 0
    assert torch.count_nonzero(lm_logits.grad) > 0
    # Without stop-gradient (the clm_no_stopgrad ablation) the copy head does get a gradient.
    copy_logits.grad = None
    losses.lm_loss(lm_logits, copy_logits, corrupted, targets, stop_gradient=False).backward()
    assert torch.count_nonzero(copy_logits.grad) > 0


def test_lm_loss_without_copy_is_plain_cross_entropy():
    torch.manual_seed(4)
    lm_logits, targets = torch.randn(6, 4), torch.randint(0, 4, (6,))
    ours = losses.lm_loss(lm_logits, torch.randn(6), targets.clone(), targets, copy_mixture=False)
    torch.testing.assert_close(ours, torch.nn.functional.cross_entropy(lm_logits, targets))


def scl_by_hand(a, b, tau):
    """Loop over the 2N views: -log exp(cos(i, partner)/tau) / sum_{j != i} exp(cos(i, j)/tau)."""
    views = torch.cat([a, b]).double()
    n2 = views.shape[0]
    n = n2 // 2
    total, negatives_seen = 0.0, []
    for i in range(n2):
        partner = (i + n) % n2
        cos = [torch.nn.functional.cosine_similarity(views[i], views[j], dim=0) / tau for j in range(n2)]
        others = [j for j in range(n2) if j != i]
        negatives_seen.append(len([j for j in others if j != partner]))
        denominator = sum(torch.exp(cos[j]) for j in others)
        total = total - torch.log(torch.exp(cos[partner]) / denominator)
    return total / n2, negatives_seen


@pytest.mark.parametrize("tau", [1.0, 0.1])
def test_scl_is_symmetric_with_2n_minus_2_negatives(tau):
    torch.manual_seed(5)
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    expected, negatives = scl_by_hand(a, b, tau)
    assert negatives == [2 * 4 - 2] * 8
    torch.testing.assert_close(losses.scl_loss(a, b, tau).double(), expected)


def test_scl_with_gathered_negatives_matches_the_global_loss_and_grads_only_local():
    """Two workers: each worker's loss over its local views against all 2M views; their mean is the global loss."""
    torch.manual_seed(6)
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    expected, _ = scl_by_hand(a, b, 1.0)
    worker_losses = []
    for rank in range(2):
        local = slice(3 * rank, 3 * rank + 3)
        la, lb = a[local].clone().requires_grad_(), b[local].clone().requires_grad_()
        everyone = iter([torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(b, dim=-1)])

        def gather(x, rank=rank, everyone=everyone):
            # What all_gather_with_grad returns: every worker's rows, detached but for the local slice.
            full = next(everyone).detach()
            return torch.cat([full[: 3 * rank], x, full[3 * rank + 3 :]]), 3 * rank

        loss = losses.scl_loss(la, lb, 1.0, gather)
        loss.backward()
        assert torch.count_nonzero(la.grad) > 0 and torch.count_nonzero(lb.grad) > 0
        worker_losses.append(loss.double())
    torch.testing.assert_close(sum(worker_losses) / 2, expected)


def _gather_worker(rank: int, port: int, queue) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.full((2, 3), float(rank + 1), requires_grad=True)
    full, offset = losses.all_gather_with_grad(x)
    (full * torch.arange(1.0, 5.0)[:, None]).sum().backward()  # weight rows so the local slice is visible
    queue.put((rank, full.detach().tolist(), offset, x.grad.tolist()))
    dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_all_gather_with_grad_across_two_real_processes():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gather_worker, args=(rank, port, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=50) for _ in procs)
    for p in procs:
        p.join(10)
    for rank, full, offset, grad in results:
        assert full == [[1.0] * 3, [1.0] * 3, [2.0] * 3, [2.0] * 3]
        assert offset == 2 * rank
        # Gradient reaches only the local rows, with the weights of their place in the gathered tensor.
        assert grad == [[1.0 + 2 * rank] * 3, [2.0 + 2 * rank] * 3]


def test_scl_cosines():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    pos, neg = losses.scl_cosines(a, b)
    r = 1 / math.sqrt(2)
    # positives: (a0,b0)=r, (a1,b1)=1, counted from both sides
    assert abs(pos.item() - (r + 1) / 2) < 1e-6
    # negatives per view (2N-2 = 2 each): a0:{a1=0,b1=0} a1:{a0=0,b0=r} b0:{a1=r,b1=r} b1:{a0=0,b0=r}
    assert abs(neg.item() - (4 * r) / 8) < 1e-6


def test_mlm_loss_is_cross_entropy():
    logits, targets = torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0])
    expected = -math.log(math.exp(2) / (math.exp(2) + 2))
    assert abs(losses.mlm_loss(logits, targets).item() - expected) < 1e-6
