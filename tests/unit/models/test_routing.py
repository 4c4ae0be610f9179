"""models/routing.py on a tiny random HF Qwen3-MoE (fp32, one rank): the recorded routing is a function of
(row, position) only (padded, packed and token-budget micro-batches record the same experts), it is the top-k
of the router's own logits computed by hand, the counts are a bincount of it; a replay routes to the recorded
experts after the router moved (and the router still gets gradients); the expert bias stays frozen."""
import dataclasses

import pytest
import torch

from rlhf_mcore.models.routing import RoutingHooks, from_router_order, moe_routers
from rlhf_mcore.trainer.schedule import forward_collect, split_micro_batches
from tests.support.tiny_moe import EXPERTS, NUM_LAYERS, TOPK, load_tiny_moe

B, S = 6, 20


@pytest.fixture(scope="module")
def moe(tmp_path_factory, mcore_ctx):
    return load_tiny_moe(tmp_path_factory.mktemp("moe"), mcore_ctx)


def make_batch() -> dict:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([20, 7, 13, 5, 18, 11])
    tokens = torch.randint(3, 250, (B, S), generator=gen) * (torch.arange(S)[None] < lengths[:, None])
    return {"tokens": tokens, "lengths": lengths}


def zero_logp(mb, output, non_loss_data=True):
    rows = mb["unpack_index"] if "unpack_index" in mb else mb["tokens"]
    return {"logp": torch.zeros(rows.shape)}


def record(model, ctx, batch, **batching) -> RoutingHooks:
    mbs = split_micro_batches(batch, **batching)
    with RoutingHooks([model], record_shape=(B, S)) as hooks:
        forward_collect([model], mbs, zero_logp, ("logp",), S, ctx.pgs.pp, hooks=hooks)
    return hooks


def valid_mask(batch) -> torch.Tensor:
    return torch.arange(S)[None] < batch["lengths"][:, None]  # [B, S]


def test_recording_is_layout_independent_and_the_routers_top_k(moe, mcore_ctx):
    batch, valid = make_batch(), valid_mask(make_batch())
    inputs = {}
    handles = [r.register_forward_pre_hook(lambda m, a: inputs.__setitem__(m.layer_number, a[0].detach()))
               for r in moe_routers(moe)]
    whole = record(moe, mcore_ctx, batch, micro_batch_size=B)  # one padded micro-batch: the hooks see [S, B, h]
    for h in handles:
        h.remove()
    layouts = {"padded 2": dict(micro_batch_size=2), "packed": dict(micro_batch_size=3, pack=True),
               "budget 40": dict(micro_batch_size=2, max_tokens=40)}
    for name, batching in layouts.items():
        other = record(moe, mcore_ctx, batch, **batching)
        assert torch.equal(other.recorded[valid], whole.recorded[valid]), name
        assert torch.equal(other.counts, whole.counts), name
    assert whole.recorded.shape == (B, S, NUM_LAYERS, TOPK)
    for position, router in enumerate(moe_routers(moe)):
        logits = inputs[router.layer_number].float() @ router.weight.float().t()  # [S, B, E]
        by_hand = logits.topk(TOPK, dim=-1).indices.transpose(0, 1)  # [B, S, k]; norm_topk_prob: top-k of logits
        assert torch.equal(whole.recorded[:, :, position][valid].long(), by_hand[valid])
        count = torch.bincount(by_hand[valid].reshape(-1), minlength=EXPERTS).double()
        assert torch.equal(whole.counts[router.layer_number - 1], count)
    assert whole.counts.sum() == valid.sum() * TOPK * NUM_LAYERS


def test_replay_routes_to_the_recorded_experts_after_the_router_moved(moe, mcore_ctx):
    batch, valid = make_batch(), valid_mask(make_batch())
    recorded = record(moe, mcore_ctx, batch, micro_batch_size=2).recorded
    used, current = {}, {}

    def capture(router, args, output):
        used[router.layer_number] = from_router_order(output[1].detach(), current["mb"])  # [b, s, E] bool

    routers = moe_routers(moe)
    saved = [r.weight.detach().clone() for r in routers]
    handles = [r.register_forward_hook(capture) for r in routers]
    try:
        with torch.no_grad():
            for r in routers:
                r.weight.add_(torch.randn(r.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
        mb = split_micro_batches({**batch, "routed_experts": recorded}, micro_batch_size=B, pack=True)[0]
        current["mb"] = mb
        moved = {}
        for replay in (True, False):
            moe.train()
            with RoutingHooks([moe], replay=replay) as hooks:
                hooks.before(moe, mb)
                from rlhf_mcore.models.packed import packed_seq_params

                out = moe(mb["tokens"], mb["position_ids"], None, packed_seq_params=packed_seq_params(mb, "sbhd"))
                hooks.after(moe, mb)
            rows = mb["row_index"]
            for position, r in enumerate(routers):
                expected = torch.zeros(B, S, EXPERTS, dtype=torch.bool)
                expected.scatter_(-1, recorded[:, :, position].long(), True)
                got = used[r.layer_number]  # rows in mb order, packed width
                differ = (got != expected[rows, :got.size(1)]).any(-1) & valid[rows, :got.size(1)]
                moved[(replay, position)] = int(differ.sum())
            if replay:
                out.float().pow(2).sum().backward()
                assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers)
        assert all(moved[(True, p)] == 0 for p in range(NUM_LAYERS)), moved
        assert sum(moved[(False, p)] for p in range(NUM_LAYERS)) > 0, moved  # the routers did move
        assert all(r.router_replay.router_replay_action is None for r in routers)  # closed: the rollout routes
    finally:
        moe.zero_grad(set_to_none=True)
        moe.eval()
        for h in handles:
            h.remove()
        with torch.no_grad():
            for r, w in zip(routers, saved):
                r.weight.copy_(w)


def test_the_expert_bias_stays_frozen(mcore_ctx):
    """A router with an expert bias (DeepSeek-V3 style, sigmoid scores): megatron updates the bias after every
    step (finalize_model_grads -> _update_router_expert_bias) at its default rate, never at ours."""
    from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias
    from megatron.core.transformer.moe.router import TopKRouter

    from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
    from rlhf_mcore.models.transformer_config import to_transformer_config
    from tests.support.tiny_moe import tiny_moe

    ours = to_transformer_config(tiny_moe(True).config.to_dict(), ModelConfig(), ParallelConfig())
    assert ours.moe_router_bias_update_rate == 0.0
    changed = {}
    for name, rate in (("ours", ours.moe_router_bias_update_rate), ("megatron default", 1e-3)):
        tc = dataclasses.replace(ours, moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid",
                                 moe_router_bias_update_rate=rate)
        router = TopKRouter(tc, pg_collection=mcore_ctx.pgs)
        router.set_layer_number(1)
        router.train()
        router(torch.randn(7, 2, tc.hidden_size))  # grad enabled: counts the tokens per expert
        before = router.expert_bias.clone()
        _update_router_expert_bias([router], tc)
        changed[name] = not torch.equal(router.expert_bias, before)
    assert changed == {"ours": False, "megatron default": True}
