"""Training passes through a vision LM (models/vision_step.py via trainer/schedule.py): the old-log-prob pass of a tiny
random Qwen2.5-VL, and of a Qwen3-VL (DeepStack), with images in the step batch's per-row form gives transformers'
log-probs (fp32, <= 1e-5) in padded and in packed micro-batches; the update's gradients reach the language model, the
vision tower only when model.freeze_vision_tower=false, and are the same padded or packed."""
from functools import partial

import pytest
import torch

from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches, to_device
from tests.support.tiny_vl import FAMILIES, family_in, image_batch, save_tiny_family, vl_actor, vl_step_batch

TOL = 1e-5


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def vl_dir(tmp_path_factory, request):
    return save_tiny_family(request.param, tmp_path_factory.mktemp(f"vl_train_{request.param}") / "hf")


def family_of(vl_dir) -> tuple:
    """(tiny model builder, patch size) of the family saved in `vl_dir`."""
    return FAMILIES[family_in(vl_dir)]


@pytest.fixture(autouse=True)
def full_fp32(monkeypatch):
    """fp32 on a GPU is fp32: no TF32 in cuDNN's convolutions (the towers' patch embedding) or in matmuls."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(precision)


def transformers_logp(vl_dir, device, batch_seed: int = 0) -> torch.Tensor:
    """transformers' log-probs of image_batch, on `device` (the actor's: one device's kernels on both sides)."""
    build, patch_dim = family_of(vl_dir)
    b = to_device(image_batch(batch_seed, patch_dim), device)
    with torch.no_grad():
        logits = build().to(device)(**b).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, b["input_ids"][:, 1:, None])[..., 0]
    return torch.nn.functional.pad(logp, (1, 0)).cpu()  # column t: log p(token t | tokens < t)


def passes(cfg, state, mcore_ctx, split: dict, patch_dim: int):
    """(old log-probs [B, S], {param: grad}) of one forward-only pass and one update's backward."""
    from rlhf_mcore.trainer.optim import zero_grads

    batch = to_device(vl_step_batch(0, patch_dim), mcore_ctx.device)
    fn = partial(actor_loss, model=state.module, tp_group=mcore_ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=16.0)
    logp = forward_collect(state.model, split_micro_batches(batch, **split), fn, ("logp",), batch["tokens"].size(1),
                           mcore_ctx.pgs.pp)["logp"]
    zero_grads(state)
    batch["old_logp"] = logp + 0.05 * batch["advantages"] * batch["response_mask"]
    run_schedule(state.model, split_micro_batches(batch, **split), fn, forward_only=False)
    grads = {n: (p.main_grad if hasattr(p, "main_grad") else p.grad).clone()
             for n, p in state.module.named_parameters() if p.requires_grad}
    return logp, grads


@pytest.mark.parametrize("freeze", [True, False])
def test_log_probs_are_transformers_and_gradients_reach_the_right_parts(vl_dir, mcore_ctx, freeze):
    cfg, state = vl_actor(vl_dir, mcore_ctx, freeze)
    patch_dim = family_of(vl_dir)[1]
    want, mask = transformers_logp(vl_dir, mcore_ctx.device), vl_step_batch(0, patch_dim)["response_mask"].bool()
    padded, grads = passes(cfg, state, mcore_ctx, {"micro_batch_size": 2}, patch_dim)
    packed, packed_grads = passes(cfg, state, mcore_ctx, {"micro_batch_size": 2, "max_tokens": 20, "pack": True},
                                  patch_dim)
    for name, got in (("padded", padded), ("packed", packed)):
        err = float((got.cpu() - want).abs()[mask].max())
        print(f"{vl_dir.parent.name} {name} old log-probs vs transformers: max |diff| = {err:.2e}")
        assert err <= TOL
    tower = {n for n in grads if n.startswith("vision_tower.")}
    assert bool(tower) == (not freeze)  # a frozen tower has no trainable parameter in the actor
    assert all(float(grads[n].abs().sum()) > 0 for n in grads), [n for n in grads if not grads[n].abs().sum()]
    for name, g in grads.items():
        assert torch.allclose(g, packed_grads[name], atol=TOL, rtol=1e-4), name


@pytest.mark.parametrize("split", [{"micro_batch_size": 4}, {"micro_batch_size": 4, "max_tokens": 64, "pack": True}],
                         ids=["padded", "packed"])
def test_the_tower_runs_once_per_prompt_and_log_probs_and_gradients_are_unchanged(vl_dir, mcore_ctx, split):
    """Three samples of each prompt (one group_index, the rows' images equal): the tower sees each prompt's image
    once per micro-batch, and the log-probs and the gradients (a trained tower) are those of the tower run on every
    row (the same batch without group_index)."""
    from rlhf_mcore.models.vision import vision_side
    from rlhf_mcore.trainer.optim import zero_grads

    cfg, state = vl_actor(vl_dir, mcore_ctx, freeze=False)
    grouped = {k: v.repeat_interleave(3, 0).to(mcore_ctx.device)
               for k, v in vl_step_batch(0, family_of(vl_dir)[1]).items()}
    grouped["group_index"] = torch.arange(3, device=mcore_ctx.device).repeat_interleave(3)
    seen = []
    hook = vision_side(state.module).tower.register_forward_pre_hook(lambda m, a, k: seen.append(a[0].size(0)),
                                                                      with_kwargs=True)
    fn = partial(actor_loss, model=state.module, tp_group=mcore_ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=16.0)

    def run(batch):
        seen.clear()
        logp = forward_collect(state.model, split_micro_batches(batch, **split), fn, ("logp",),
                               batch["tokens"].size(1), mcore_ctx.pgs.pp)["logp"]
        patches = sum(seen)
        zero_grads(state)
        batch = {**batch, "old_logp": logp + 0.05 * batch["advantages"] * batch["response_mask"]}
        run_schedule(state.model, split_micro_batches(batch, **split), fn, forward_only=False)
        grads = {n: (p.main_grad if hasattr(p, "main_grad") else p.grad).clone()
                 for n, p in state.module.named_parameters() if p.requires_grad}
        return logp, grads, patches

    shared, shared_grads, shared_patches = run(grouped)
    each, each_grads, each_patches = run({k: v for k, v in grouped.items() if k != "group_index"})
    hook.remove()
    per_image = [16, 24]  # the two images' patches (tests/support/tiny_vl.py GRIDS)
    assert each_patches == 3 * sum(per_image)  # every row's image, once each
    once = sum(sum(per_image[g] for g in set(mb["group_index"].tolist()) if g < 2)  # prompt 2 is text only
               for mb in split_micro_batches(grouped, **split))
    assert shared_patches == once < each_patches  # each prompt's image once per micro-batch
    mask = grouped["response_mask"].bool()
    assert float((shared - each).abs()[mask].max()) <= 1e-6
    assert any(n.startswith("vision_tower.") for n in shared_grads)
    for name, g in shared_grads.items():
        assert torch.allclose(g, each_grads[name], atol=TOL, rtol=1e-4), name
