"""Rollout log-probs against the trainer's on a tiny bf16 model whose logits are as large as a trained LM's
(~25, where one bf16 ulp is 0.125): both sides use fp32 logits (`kernels.logits.logits_fp32`), so the gap
is only what the engine's bf16 hidden states (KV-cache decode vs one full forward) leave, the same as
with small logits. With logits rounded to bf16 on either side it was ~10x larger (3.5e-3 vs 3e-4 here)."""
import pytest
import torch

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.heads import lm_output_weight
from rlhf_mcore.models.logprobs import token_logprobs
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout.native import NativeRolloutEngine, unwrap_model
from rlhf_mcore.rollout.static_decode import StaticDecoder
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.tiny import tiny_model_config

PARAMS = {"plain": SamplingParams(n=2, max_new_tokens=24, temperature=1.0, seed=3),  # static: the one-pass head
          "top_k_top_p": SamplingParams(n=2, max_new_tokens=24, temperature=1.0, top_k=50, top_p=0.95, seed=3)}


@pytest.fixture(scope="module")
def actor(mcore_ctx):
    cfg = tiny_model_config(dtype="bf16")
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx))
    model.eval()
    return model


def mismatch(model, ctx, static: bool, shift: float, params: SamplingParams) -> float:
    """Mean |rollout log-prob - trainer log-prob| over the response tokens, after adding `shift` / mean|h_0|
    to column 0 of the output weight: every logit of a row moves by about `shift` together (softmax, hence
    every exact log-prob, is unchanged; bf16 roundings of the logits are not)."""
    weight = lm_output_weight(model)
    saved = weight.detach().clone()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 250, (int(n),), generator=g).tolist() for n in torch.randint(3, 12, (8,), generator=g)]
    try:
        with torch.no_grad():
            h0 = model(torch.tensor([prompts[0]]), torch.arange(len(prompts[0]))[None], None)[0, :, 0]
            weight[:, 0] += shift / h0.float().abs().mean()
        engine = NativeRolloutEngine(model, ctx, pad_id=0)
        if static:  # the static decode step (what CUDA graphs capture), eager on CPU
            engine.static = StaticDecoder(model, lambda: lm_output_weight(model), use_graphs=False)
        batch = engine.generate(prompts, params)
        diffs = []
        with torch.no_grad():
            for i, (p, n) in enumerate(zip(batch.prompt_lengths.tolist(), batch.response_lengths.tolist())):
                ids = batch.tokens[i:i + 1, :p + n]
                hidden = model(ids, torch.arange(p + n)[None], None)  # [1, p + n, h]
                logp, _ = token_logprobs(model, hidden, ids, ctx.pgs.tp, temperature=params.temperature)
                diffs.append((logp[0, p:] - batch.rollout_logprobs[i, p:p + n]).abs())
        return torch.cat(diffs).mean().item()
    finally:
        with torch.no_grad():
            weight.copy_(saved)


@pytest.mark.parametrize("static,sampling", [(True, "plain"), (False, "top_k_top_p")])
def test_large_logits_do_not_widen_the_rollout_trainer_gap(actor, mcore_ctx, static, sampling):
    small = mismatch(actor, mcore_ctx, static, 0.0, PARAMS[sampling])
    large = mismatch(actor, mcore_ctx, static, 25.0, PARAMS[sampling])
    assert 0 < small < 1e-3, small  # bf16 hidden states differ a little: the gap is real, not zero
    assert large < 1e-3 and large < 2 * small, (small, large)
