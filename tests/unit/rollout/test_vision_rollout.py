"""The native engine rolls out a vision LM (rollout/vision_decode.py; Qwen2.5-VL, Qwen3-VL with DeepStack in the
prefill only, and Qwen3-VL-MoE, eagerly only), eagerly and with the static decoder: prompts with images (prefilled
with the tower's embeddings, decoded at M-RoPE positions) give the log-probs the trainer's old-log-prob pass
computes on the same rows (fp32, <= 1e-5) with the tower run once per prompt (its samples share the embeddings),
and the batch carries each row's images on to the trainer."""
from functools import partial

import pytest
import torch

from rlhf_mcore.models.registry import spec_for_hf_config
from rlhf_mcore.models.vision import vision_side
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.schedule import forward_collect, split_micro_batches
from tests.support.tiny_vl import FAMILIES, GRIDS, family_in, image_batch, save_tiny_family, vl_actor

TOL = 1e-5


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def vl_dir(tmp_path_factory, request):
    return save_tiny_family(request.param, tmp_path_factory.mktemp(f"vl_rollout_{request.param}") / "hf")


def prompts_and_images(vl_dir):
    """Three prompts of different lengths: an image each in the first two (4 and 6 tokens), text only in the third."""
    b = image_batch(0, FAMILIES[family_in(vl_dir)][1])
    ids = [row[:int(n)].tolist() for row, n in zip(b["input_ids"], b["attention_mask"].sum(1))]
    ids = [ids[0][:-2], ids[1], ids[2][:-4]]  # ragged: the chunk is left-padded
    first = GRIDS[0][0] * GRIDS[0][1] * GRIDS[0][2]
    images = [(b["pixel_values"][:first], torch.tensor([GRIDS[0]])),
              (b["pixel_values"][first:], torch.tensor([GRIDS[1]])), None]
    return ids, images


DECODERS = {"eager": {"cuda_graphs": False},  # megatron's modules, left-padded
            "static": {"static_on_cpu": True}}  # the static decoder: right-padded, CUDA-graphed on a GPU


@pytest.mark.parametrize("decoder", sorted(DECODERS))
@pytest.mark.parametrize("micro_batch_size", [0, 4])
def test_rollout_log_probs_are_the_trainers(vl_dir, mcore_ctx, micro_batch_size, decoder):
    cfg, state = vl_actor(vl_dir, mcore_ctx)
    engine = NativeRolloutEngine(state.model[0], mcore_ctx, pad_id=0, micro_batch_size=micro_batch_size,
                                 **DECODERS[decoder])
    static = decoder == "static" and "static" in spec_for_hf_config({"model_type": family_in(vl_dir)}).decode_paths
    assert (engine.static is not None) == static  # an MoE (Qwen3-VL-MoE) decodes eagerly: the static one is dense
    ids, images = prompts_and_images(vl_dir)
    params = SamplingParams(n=2, max_new_tokens=7, temperature=1.0, seed=3)
    seen = []  # the patches the tower embeds: each prompt's image once per chunk, not once per sample
    hook = vision_side(state.module).tower.register_forward_pre_hook(lambda m, a: seen.append(a[0].size(0)))
    out = engine.generate(ids, params, images=images)
    hook.remove()
    assert sum(seen) == sum(t * h * w for t, h, w in GRIDS)  # both chunkings hold a prompt's samples together
    assert out.tokens.size(0) == 6 and int(out.response_lengths.min()) == 7
    assert torch.equal(out.image_grid_thw[:, 0].cpu(), torch.tensor([GRIDS[0]] * 2 + [GRIDS[1]] * 2 + [[0, 0, 0]] * 2))
    assert torch.equal(out.pixel_values[3, :24].cpu(), images[1][0])
    batch = {"tokens": out.tokens, "lengths": out.total_lengths, "response_mask": out.response_mask.float(),
             "prompt_lengths": out.prompt_lengths,
             "pixel_values": out.pixel_values, "image_grid_thw": out.image_grid_thw}
    fn = partial(actor_loss, model=state.module, tp_group=mcore_ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=7.0)
    logp = forward_collect(state.model, split_micro_batches(batch, micro_batch_size=4), fn, ("logp",),
                           out.tokens.size(1), mcore_ctx.pgs.pp)["logp"]
    mask = out.response_mask
    err = float((logp - out.rollout_logprobs).abs()[mask].max())
    print(f"{vl_dir.parent.name} rollout vs trainer log-probs (micro_batch_size={micro_batch_size}): "
          f"max |diff| = {err:.2e}")
    assert err <= TOL  # the trainer's batch has no group_index: its tower runs on every row
    again = engine.generate(ids, params, images=images)  # same seed, same samples
    assert torch.equal(again.tokens, out.tokens)


def test_image_tokens_without_their_images_are_refused(vl_dir, mcore_ctx):
    _, state = vl_actor(vl_dir, mcore_ctx)
    engine = NativeRolloutEngine(state.model[0], mcore_ctx, pad_id=0, cuda_graphs=False)
    ids, _ = prompts_and_images(vl_dir)
    with pytest.raises(ValueError, match="image tokens without images"):
        engine.generate(ids, SamplingParams(n=1, max_new_tokens=2))


def test_rows_that_end_early_free_slots_at_rope_position_zero(vl_dir, mcore_ctx):
    """The static decoder with stop tokens (half the vocabulary: rows end after a few tokens each): a slot idled by
    the compaction to a smaller bucket decodes at RoPE position 0, not at 0 plus the delta of the image row that left
    it (negative past an image: an index of -1 into the RoPE table, a device assertion under CUDA graphs). The rows
    that ran keep the trainer's log-probs."""
    from tests.support.tiny_vl import VOCAB

    cfg, state = vl_actor(vl_dir, mcore_ctx)
    engine = NativeRolloutEngine(state.model[0], mcore_ctx, pad_id=0, static_on_cpu=True)
    ids, images = prompts_and_images(vl_dir)
    params = SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=5, stop_token_ids=tuple(range(1, VOCAB, 2)))
    out = engine.generate(ids, params, images=images)
    lengths = out.response_lengths.tolist()
    assert min(lengths) < max(lengths) <= 12 and "stop" in out.finish_reasons, lengths  # rows ended apart
    batch = {"tokens": out.tokens, "lengths": out.total_lengths, "response_mask": out.response_mask.float(),
             "prompt_lengths": out.prompt_lengths, "pixel_values": out.pixel_values,
             "image_grid_thw": out.image_grid_thw}
    fn = partial(actor_loss, model=state.module, tp_group=mcore_ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=12.0)
    logp = forward_collect(state.model, split_micro_batches(batch, micro_batch_size=4), fn, ("logp",),
                           out.tokens.size(1), mcore_ctx.pgs.pp)["logp"]
    assert float((logp - out.rollout_logprobs).abs()[out.response_mask].max()) <= TOL
