"""rollout/routing_record.py through the native engine's eager decode on a tiny random HF Qwen3-MoE (fp32, one
rank): the experts recorded for every prompt and response token of every row (left-padded prefill, rows that stop
early and are compacted out of the cache) are the ones the trainer's own forward over the assembled batch
chooses; each row's last token and the padding hold experts 0..k-1; the routers route normally afterwards."""
import pytest
import torch

from rlhf_mcore.models.routing import RoutingHooks, moe_routers
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.rollout.routing_record import stack_rows
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.trainer.schedule import forward_collect, split_micro_batches
from tests.support.tiny_moe import NUM_LAYERS, TOPK, load_tiny_moe

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18]]
# a third of the vocabulary stops a row: rows end at different steps, and the cache drops them (compaction)
PARAMS = SamplingParams(n=3, max_new_tokens=8, temperature=1.0, stop_token_ids=tuple(range(20, 258, 3)), seed=3)


@pytest.fixture(scope="module")
def moe(tmp_path_factory, mcore_ctx):
    return load_tiny_moe(tmp_path_factory.mktemp("moe"), mcore_ctx)


def trainer_routing(model, ctx, batch) -> torch.Tensor:
    """[B, S, L, k] the trainer's routing of the assembled rows (padded micro-batches of 2)."""
    b, s = batch.tokens.shape
    rows = {"tokens": batch.tokens, "lengths": batch.total_lengths}

    def no_loss(mb, output, non_loss_data=True):
        return {"logp": torch.zeros(mb["tokens"].shape)}
    with RoutingHooks([model], record_shape=(b, s)) as hooks, torch.no_grad():
        forward_collect([model], split_micro_batches(rows, micro_batch_size=2), no_loss, ("logp",), s, ctx.pgs.pp,
                        hooks=hooks)
    return hooks.recorded


def test_the_rollout_records_the_experts_the_trainer_chooses(moe, mcore_ctx, monkeypatch):
    from rlhf_mcore.rollout import kv_cache

    compactions, compact = [], kv_cache.compact
    monkeypatch.setattr(kv_cache, "compact", lambda kv, keep: compactions.append(keep.numel()) or compact(kv, keep))
    batch = NativeRolloutEngine(moe, mcore_ctx, pad_id=0, record_routing=True).generate(PROMPTS, PARAMS)
    b, s = batch.tokens.shape
    routed = batch.routed_experts
    assert routed.shape == (b, s, NUM_LAYERS, TOPK) and routed.dtype == torch.uint8
    lengths = batch.response_lengths.tolist()
    assert len(set(lengths)) > 2 and max(lengths) == PARAMS.max_new_tokens and compactions  # rows left the cache
    cols = torch.arange(s)[None]
    known = cols < batch.total_lengths[:, None] - 1  # every token but each row's last
    expected = trainer_routing(moe, mcore_ctx, batch)
    assert torch.equal(routed[known], expected[known])
    assert (routed[~known] == torch.arange(TOPK, dtype=torch.uint8)).all()  # last token, padding: 0..k-1
    assert all(r.router_replay.router_replay_action is None and r.router_replay.recorded_topk_idx is None
               for r in moe_routers(moe))


def test_without_r3_the_batch_has_no_routing(moe, mcore_ctx):
    assert NativeRolloutEngine(moe, mcore_ctx, pad_id=0).generate(PROMPTS[:2], PARAMS).routed_experts is None


def test_stack_rows_pads_each_row_to_the_batch_width():
    rows = [torch.tensor([[[4, 2]], [[1, 7]]]), torch.tensor([[[3, 5]]])]  # [n_i, L=1, k=2]
    assert stack_rows(rows, 3)[:, :, 0].tolist() == [[[4, 2], [1, 7], [0, 1]], [[3, 5], [0, 1], [0, 1]]]
