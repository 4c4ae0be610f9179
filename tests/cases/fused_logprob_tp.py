"""`fused_logprob_tp` under 2 ranks (gloo, CPU): vocab-parallel fused_logprob_entropy vs TP1.

Every rank builds the same problem, keeps its own vocab rows of the weight, and checks logp, entropy,
dL/dhidden (full, after the backward all-reduce) and dL/dweight (its own rows) against the single-process
fused path and the full-logits reference, to 1e-5. Shards are uneven, and in one case empty.
With TP_WORKER_DEVICE=cuda it runs the same checks with NCCL on one GPU per rank (the Triton path), to 1e-4.
"""
import os

import torch
import torch.distributed as dist
from rlhf_mcore.kernels.fused_logprob import fused_logprob_entropy, reference_logprob_entropy

N, H, V, TEMPERATURE = 29, 12, 101, 0.8
DEVICE = os.environ.get("TP_WORKER_DEVICE", "cpu")
TOL = 1e-5 if DEVICE == "cpu" else 1e-4


def run(fn, hidden, weight, targets, coef, **kw):
    hidden = hidden.clone().requires_grad_(True)
    weight = weight.clone().requires_grad_(True)
    logp, entropy = fn(hidden, weight, targets, temperature=TEMPERATURE, **kw)
    ((logp * coef[0]).sum() + (entropy * coef[1]).sum()).backward()
    return logp.detach(), entropy.detach(), hidden.grad, weight.grad


def main(argv: list[str]):
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo" if DEVICE == "cpu" else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "run with --nproc_per_node 2"
    g = torch.Generator().manual_seed(0)  # the same problem on every rank
    dev = torch.device(DEVICE, torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")
    hidden, weight = torch.randn(N, H, generator=g).to(dev), (torch.randn(V, H, generator=g) * 0.5).to(dev)
    targets, coef = torch.randint(0, V, (N,), generator=g).to(dev), torch.randn(2, N, generator=g).to(dev)
    tp1 = run(fused_logprob_entropy, hidden, weight, targets, coef, chunk_size=8)
    ref = run(reference_logprob_entropy, hidden, weight, targets, coef)
    for bounds in ([0, 60, V], [0, V, V]):  # uneven shards; rank 1 empty
        lo, hi = bounds[rank], bounds[rank + 1]
        tp2 = run(fused_logprob_entropy, hidden, weight[lo:hi], targets, coef, chunk_size=8,
                  tp_group=dist.group.WORLD, vocab_start=lo)
        for name, got, want_tp1, want_ref in zip(("logp", "entropy", "d_hidden"), tp2, tp1, ref):
            torch.testing.assert_close(got, want_tp1, atol=TOL, rtol=TOL, msg=f"{name} vs TP1 {bounds}")
            torch.testing.assert_close(got, want_ref, atol=TOL, rtol=TOL, msg=f"{name} vs ref {bounds}")
        torch.testing.assert_close(tp2[3], tp1[3][lo:hi], atol=TOL, rtol=TOL, msg=f"d_weight {bounds}")
        torch.testing.assert_close(tp2[3], ref[3][lo:hi], atol=TOL, rtol=TOL, msg=f"d_weight ref {bounds}")
    dist.barrier()
    print(f"rank {rank}: TP2 fused_logprob_entropy OK ({DEVICE})")
    dist.destroy_process_group()


def entry(argv: list[str]) -> None:
    main(argv)
