"""The plan's dynamic and rollout terms against the code that allocates them (the micro-batch split, the static
decoder's state) and against hand counts at the Qwen2.5-0.5B shape of benchmarks/2026-12-04-memory-plan."""
import pytest
import torch

from rlhf_mcore.plan.dynamic import layer_activation_bytes, logprob_backward_bytes, micro_batch_tokens
from rlhf_mcore.plan.params import Shape
from rlhf_mcore.plan.rollout import bucket_for, prefill_layer_bytes, static_state_bytes
from rlhf_mcore.rollout import static_decode
from rlhf_mcore.rollout.decode_state import DecodeState
from rlhf_mcore.trainer.schedule import split_micro_batches

Q05 = Shape(layers=24, hidden=896, ffn=4864, heads=14, groups=2, head_dim=64, vocab=151936, qkv_bias=True, tied=True)


@pytest.mark.parametrize("pack,dynamic,budget", [(True, False, 65536), (False, True, 65536), (False, False, 0),
                                                 (True, False, 0)])
def test_micro_batch_tokens_is_the_largest_split(pack, dynamic, budget):
    rows, length = 40, 24
    batch = {"tokens": torch.zeros(rows, length, dtype=torch.long), "lengths": torch.full((rows,), length)}
    mbs = split_micro_batches(batch, micro_batch_size=6, max_tokens=budget // 512, pack=pack, dynamic=dynamic)
    largest = max(mb["tokens"].numel() for mb in mbs)
    assert micro_batch_tokens(rows, length, 6, budget // 512, pack, dynamic) == largest


def test_the_static_state_is_the_decoders_allocation():
    s = Shape(layers=3, hidden=32, ffn=64, heads=4, groups=2, head_dim=8, vocab=100)
    for rows in (3, 50, 512):
        state = DecodeState.allocate(s.layers, bucket_for(rows), s.groups, 40, s.head_dim, 16, torch.bfloat16, "cpu")
        allocated = sum(t.numel() * t.element_size() for t in vars(state).values())
        assert static_state_bytes(s, rows, 40, 16, "bf16") == allocated
    assert all(bucket_for(n) == static_decode.bucket_for(n) for n in range(1, 3000))


def test_the_terms_at_the_qwen_0_5b_shape_by_hand():
    # a layer, a token: norms' inputs + linear inputs 4 x 896, fused q/k/v (14 + 4) x 64, rotated q/k (14 + 2) x 64,
    # attention output 14 x 64, fc1 output 2 x 4864, fc2 input 4864 (bf16); rstd 2 x 4 B, log-sum-exp 14 x 4 B
    packed = (4 * 896 + (18 + 16 + 14) * 64 + 3 * 4864) * 2 + 8 + 56
    assert layer_activation_bytes(Q05, 1, "bf16") == packed == 42_560
    assert layer_activation_bytes(Q05, 1, "bf16", out_copy=True) == packed + 14 * 64 * 2  # padded SDPA's copy
    # the fused kernel's backward at 24,576 tokens: 4096 x 151,936 x (4 + 2) + 24,576 x 896 x 4 + 151,936 x 896 x 6
    assert logprob_backward_bytes(Q05, 24576, 1, "bf16") == 3_733_979_136 + 88_080_384 + 816_807_936
    # the prefill of 512 rows x 128 prompt tokens: (4 x 896 + (28 + 6) x 64 + 3 x 4864) x 2 B a token
    assert prefill_layer_bytes(Q05, 512 * 128, "bf16") == 65536 * 20352 * 2
