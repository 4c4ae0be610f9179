"""Packed sequences through the real models: the same log-probs, values, losses and gradients as the padded
layout (fp32, ragged batch), a sequence unaffected by its neighbours, RoPE restarting at every boundary."""
from functools import partial

import pytest
import torch

from rlhf_mcore.data.packing import pack_rows
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.packed import PackedSeqs, packed_seq_params, sdpa_mask_attention
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.trainer.losses import actor_loss, critic_loss
from rlhf_mcore.trainer.optim import build_train_state, zero_grads
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches
from tests.support.tiny import tiny_model_config

TOL = 1e-5


def ragged_batch(num=7, seq=29, vocab=250, seed=3) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, seq + 1, (num,), generator=g)
    lengths[2] = seq  # one full row, one very short
    lengths[4] = 3
    prompt = torch.randint(1, 3, (num,), generator=g)
    pos = torch.arange(seq).unsqueeze(0)
    valid = pos < lengths.unsqueeze(1)
    return {"tokens": torch.randint(1, vocab, (num, seq), generator=g) * valid, "lengths": lengths,
            "response_mask": (valid & (pos >= prompt.unsqueeze(1))).float(),
            "advantages": torch.randn(num, seq, generator=g), "returns": torch.randn(num, seq, generator=g),
            "values": torch.randn(num, seq, generator=g) * 0.1, "nudge": torch.randn(num, seq, generator=g)}


def run_role(role, batch, mcore_ctx, hf_fields=None, **split):
    """(per-token outputs [B, S] of a forward pass, (loss_sum, count), {param: grad}) for one role;
    hf_fields: config.json fields over the tiny model's (a RoPE scaling)."""
    batch = {k: v.to(mcore_ctx.device) for k, v in batch.items()}
    cfg = tiny_model_config()
    hf = {**load_hf_config(cfg.model), **(hf_fields or {})}
    torch.manual_seed(0)
    state = build_train_state(build_model(role, hf, cfg.model, cfg.parallel, mcore_ctx), cfg.actor.optim,
                              cfg.parallel)
    if role == "actor":
        fn, keys = partial(actor_loss, model=state.module, tp_group=mcore_ctx.pgs.tp, actor_cfg=cfg.actor,
                           temperature=0.9, norm_length=32.0), ("logp", "sum_pi_squared")
        forward_fn = partial(fn, with_sum_pi_squared=True)
    else:
        fn, keys = partial(critic_loss, cliprange_value=0.2), ("values",)
        forward_fn = fn
    outs = forward_collect(state.model, split_micro_batches(batch, **split), forward_fn, keys,
                           batch["tokens"].size(1), mcore_ctx.pgs.pp)
    out = torch.cat([outs[k] for k in keys], dim=1)  # [B, S * len(keys)]
    batch = {**batch, "old_logp": outs[keys[0]] + 0.1 * batch["nudge"] * batch["response_mask"]}
    zero_grads(state)
    reports = run_schedule(state.model, split_micro_batches(batch, **split), fn, forward_only=False)
    loss = sum(r[f"{role}/loss_sum"] for r in reports), sum(int(r[f"{role}/loss_count"]) for r in reports)
    grads = {n: p.main_grad.clone() for n, p in state.module.named_parameters()}
    return out, loss, grads


@pytest.mark.parametrize("role,rope", [("actor", "default"), ("critic", "default"), ("actor", "yarn")])
def test_packed_equals_padded(role, rope, mcore_ctx):
    """yarn: the packed path's RoPE carries YaRN's attention factor too (the padded one gives transformers' logits,
    tests/unit/models/test_weights.py)."""
    from tests.support.tiny_hf import YARN

    fields = {"rope_scaling": YARN, "max_position_embeddings": 1024} if rope == "yarn" else None
    batch = ragged_batch()
    mask = batch["response_mask"].to(mcore_ctx.device).repeat(1, 2 if role == "actor" else 1)
    out_pad, loss_pad, grads_pad = run_role(role, batch, mcore_ctx, fields, micro_batch_size=3)
    out_pack, loss_pack, grads_pack = run_role(role, batch, mcore_ctx, fields, max_tokens=48, pack=True)
    assert float(((out_pad - out_pack) * mask).abs().max()) <= TOL
    assert loss_pad[1] == loss_pack[1]
    assert abs(float(loss_pad[0] - loss_pack[0])) <= TOL * max(1, abs(float(loss_pad[0])))
    for name, g in grads_pad.items():
        assert torch.allclose(g, grads_pack[name], atol=TOL, rtol=TOL), name
    assert any(g.abs().sum() > 0 for g in grads_pack.values())


def _packed_logp(model, batch, rows, mcore_ctx):
    mb = pack_rows(batch, rows, batch["lengths"].tolist())
    hidden = model(mb["tokens"], mb["position_ids"], None, packed_seq_params=packed_seq_params(mb, "sbhd"))
    return actor_loss(mb, hidden, True, model=model, tp_group=mcore_ctx.pgs.tp, actor_cfg=None, temperature=1.0,
                      norm_length=1.0)["logp"]


def test_sequence_unchanged_by_its_neighbour(mcore_ctx):
    cfg = tiny_model_config()
    model = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    batch = {k: v.to(mcore_ctx.device) for k, v in ragged_batch().items()}
    alone = _packed_logp(model, batch, [1], mcore_ctx)  # [1, L]
    for rows in ([0, 1], [1, 5], [2, 1, 3]):
        together = _packed_logp(model, batch, sorted(rows), mcore_ctx)
        got = together[sorted(rows).index(1), :alone.size(1)]
        assert torch.allclose(got, alone[0], atol=TOL), rows
    pos = torch.arange(batch["tokens"].size(1), device=mcore_ctx.device).unsqueeze(0)
    mb = {"tokens": batch["tokens"][1:2]}
    padded = actor_loss(mb, model(mb["tokens"], pos, None), True, model=model, tp_group=mcore_ctx.pgs.tp,
                        actor_cfg=None, temperature=1.0, norm_length=1.0)["logp"]
    assert torch.allclose(padded[:, :alone.size(1)], alone, atol=TOL)
    assert alone[0, 1:].abs().min() > 0


def test_rope_positions_restart_at_every_boundary(mcore_ctx):
    cfg = tiny_model_config()
    model = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    batch = {k: v.to(mcore_ctx.device) for k, v in ragged_batch().items()}
    mb = pack_rows(batch, [0, 3, 4], batch["lengths"].tolist(), multiple=4)
    lens = [int(batch["lengths"][i]) for i in (0, 3, 4)]
    expected = torch.cat([torch.arange(n) for n in lens] + [torch.arange(mb["tokens"].size(1) - sum(lens))])
    expected = expected.to(mcore_ctx.device)
    assert torch.equal(mb["position_ids"][0], expected)
    seen = {}
    model.rotary_pos_emb.register_forward_hook(lambda m, a, out: seen.setdefault("emb", out))
    model(mb["tokens"], mb["position_ids"], None, packed_seq_params=packed_seq_params(mb, "sbhd"))
    table = model.rotary_pos_emb.get_emb(max(lens))
    assert seen["emb"].shape[0] == mb["tokens"].size(1)
    assert torch.equal(seen["emb"], table[expected])  # token j of every sequence gets row j of the table


def test_rope_table_outside_a_forward_is_the_plain_table_after_a_packed_forward(mcore_ctx):
    """The native engine's static decoder reads `model.rotary_pos_emb(length)` between trainer passes: after a
    packed forward it must get the plain [length] table, not one indexed by the packed positions."""
    cfg = tiny_model_config()
    model = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    batch = {k: v.to(mcore_ctx.device) for k, v in ragged_batch().items()}
    length = batch["tokens"].size(1)
    plain = model.rotary_pos_emb(length).clone()
    mb = pack_rows(batch, [0, 3, 4], batch["lengths"].tolist(), multiple=4)
    model(mb["tokens"], mb["position_ids"], None, packed_seq_params=packed_seq_params(mb, "sbhd"))
    assert torch.equal(model.rotary_pos_emb(length), plain)


def test_mask_kernel_equals_attention_per_sequence():
    g = torch.Generator().manual_seed(0)
    lens = [5, 1, 7, 3]
    q, k, v = torch.randn(16, 4, 8, generator=g), torch.randn(16, 2, 8, generator=g), torch.randn(16, 2, 8, generator=g)
    cu = torch.tensor([0, 5, 6, 13, 16], dtype=torch.int32)
    out = sdpa_mask_attention(q, k, v, PackedSeqs(cu_seqlens_q=cu, max_seqlen_q=7), 0.3)
    for start, n in zip(cu[:-1].tolist(), lens):
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=0.3, enable_gqa=True)
        assert torch.allclose(out[start:start + n], ref.transpose(0, 1), atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [None, 16])
@pytest.mark.parametrize("name", ["varlen", "flash"])
def test_flash_kernels_match_mask_kernel_on_gpu(name, window):
    from rlhf_mcore.models.packed import PACKED_KERNELS, choose_packed_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(300, 14, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(300, 2, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cu = torch.tensor([0, 100, 101, 260, 300], device="cuda", dtype=torch.int32)
    params = PackedSeqs(cu_seqlens_q=cu, max_seqlen_q=159)
    assert choose_packed_kernel(q, window is not None) in ("varlen", "flash")
    got = PACKED_KERNELS.get(name)(q, k, v, params, 0.125, window)
    ref = sdpa_mask_attention(q, k, v, params, 0.125, window)
    assert (got.float() - ref.float()).abs().max() < 2e-2


def test_kernel_probe_runs_under_no_grad():
    """The first packed call is often a forward-only log-prob pass under no_grad; the probe of a fast kernel
    compares gradients too, so it must not fail there (on the H200 this silently fell back to sdpa_mask)."""
    from rlhf_mcore.models.packed import _probe

    with torch.no_grad():
        assert _probe("sdpa_mask", torch.device("cpu"), torch.float32)
