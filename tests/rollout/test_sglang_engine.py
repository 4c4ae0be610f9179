"""The embedded SGLang engine: what can be checked without a GPU (the weights it starts from are the
actor's, reproduced by transformers; response post-processing; clear errors), and on a GPU the engine
itself against the native engine."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.logprobs import full_logits
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout.responses import Response
from rlhf_mcore.rollout.sglang_engine import (
    actor_hf_state,
    check_supported,
    cut_at_stop_string,
    to_response,
    write_hf_dir,
)
from tests.conftest import tiny_model_config


def test_engine_starts_from_the_actors_weights(mcore_ctx, tmp_path):
    """The HF directory handed to SGLang computes exactly what our actor computes (checked in transformers)."""
    cfg = tiny_model_config(tie_embeddings=True)
    hf = load_hf_config(cfg.model)
    actor = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    path = write_hf_dir(actor_hf_state(actor, hf), hf, torch.float32)
    assert json.load(open(f"{path}/config.json"))["architectures"] == ["LlamaForCausalLM"]
    tokens = torch.randint(0, 250, (2, 11), generator=torch.Generator().manual_seed(3))
    ours = full_logits(actor, actor(tokens, torch.arange(11).expand(2, 11), None), mcore_ctx.pgs.tp)
    theirs = AutoModelForCausalLM.from_pretrained(path).eval()(tokens).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_responses_from_engine_outputs():
    out = {"output_ids": [5, 6, 7], "meta_info": {"finish_reason": {"type": "stop"},
                                                  "output_token_logprobs": [(-0.1, 5, None), (-0.2, 6, None),
                                                                            (-0.3, 7, None)]}}
    assert to_response(out) == Response([5, 6, 7], [-0.1, -0.2, -0.3], "stop")
    decode = lambda ids: "".join(chr(96 + i) for i in ids)  # noqa: E731  1 -> a, 2 -> b, ...
    cut = cut_at_stop_string(Response([1, 2, 3, 4], [-1.0] * 4, "length"), ("bc",), decode)
    assert cut == Response([1, 2, 3], [-1.0] * 3, "stop")
    same = Response([1, 1], [-1.0, -1.0], "length")
    assert cut_at_stop_string(same, ("bc",), decode) == same


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only error path")
def test_needs_a_gpu(mcore_ctx):
    with pytest.raises(ValueError, match="rollout.engine: sglang needs a CUDA GPU"):
        check_supported(mcore_ctx)


@pytest.mark.gpu
def test_sglang_engine_matches_the_trainer_and_follows_weight_updates(mcore_ctx):
    """Engine log-probs agree with the trainer's recomputation (bf16 kernels differ: mean |diff| < 0.02),
    and after update_weights the engine samples from the new weights."""
    import dataclasses

    from rlhf_mcore.models.logprobs import token_logprobs
    from rlhf_mcore.rollout.sglang_engine import SGLangRolloutEngine
    from rlhf_mcore.rollout.types import SamplingParams

    cfg = tiny_model_config(hidden_size=256, ffn_hidden_size=512, num_attention_heads=4, num_query_groups=2,
                            vocab_size=258, dtype="bf16")
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, gpu_memory_utilization=0.3))
    actor = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    engine = SGLangRolloutEngine(actor, mcore_ctx, pad_id=257, cfg=cfg)
    prompts = torch.randint(0, 256, (8, 12), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(n=2, max_new_tokens=24, temperature=1.0, stop_token_ids=(256,))

    def mismatch():
        batch = engine.generate(prompts, params)
        with torch.no_grad():
            pos = torch.arange(batch.tokens.size(1), device=batch.tokens.device).expand_as(batch.tokens)
            logp, _ = token_logprobs(actor, actor(batch.tokens, pos, None), batch.tokens, mcore_ctx.pgs.tp)
        mask = batch.response_mask
        return (logp[mask] - batch.rollout_logprobs[mask]).abs().mean().item(), batch

    before, batch = mismatch()
    assert batch.tokens.shape[0] == 16 and before < 0.02, before
    with torch.no_grad():
        actor.output_layer.weight.mul_(3.0)  # a sharper policy: log-probs change a lot
    engine.release_memory()
    engine.resume_memory()
    engine.update_weights(actor)
    after, _ = mismatch()
    assert after < 0.05, after  # the engine now samples from the updated weights
    engine.shutdown()


def test_weight_refresh_in_buckets_with_one_flush(mcore_ctx):
    """update_weights sends every HF tensor exactly once, equal to the converter's, in buckets of at most
    weight_bucket_mb (a larger tensor alone), flushing the prefix cache only with the last bucket."""
    from rlhf_mcore.convert.mcore import full_state_dict
    from rlhf_mcore.models.weights import mcore_to_hf
    from rlhf_mcore.rollout.sglang_engine import SGLangRolloutEngine

    class Recorder:
        def __init__(self):
            self.calls = []

        def update_weights_from_tensor(self, named, flush_cache):
            self.calls.append(([(n, t.clone()) for n, t in named], flush_cache))
            return True, "Success"

    cfg = tiny_model_config(tie_embeddings=True)
    hf = load_hf_config(cfg.model)
    actor = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    engine = object.__new__(SGLangRolloutEngine)  # no sglang.Engine: the sending logic only
    engine.hf_cfg, engine.bucket_bytes, engine.engine = hf, 40_000, Recorder()
    engine.update_weights(actor)
    want = mcore_to_hf(full_state_dict(actor), hf, role="actor")
    sent = [pair for named, _ in engine.engine.calls for pair in named]
    assert [n for n, _ in sent] == list(want) and all(torch.equal(t, want[n]) for n, t in sent)
    assert [flush for _, flush in engine.engine.calls] == [False] * (len(engine.engine.calls) - 1) + [True]
    assert len(engine.engine.calls) > 2
    for named, _ in engine.engine.calls:
        size = sum(t.numel() * t.element_size() for _, t in named)
        assert size <= engine.bucket_bytes or len(named) == 1


def test_engine_arguments_follow_the_config():
    """Decode CUDA graphs cover the per-rank rollout batch unless set; the attention backend is the key's."""
    from rlhf_mcore.config.load import load_config
    from rlhf_mcore.rollout.sglang_engine import engine_kwargs
    from tests.conftest import ROOT

    cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", ["data.train_batch_size=64", "rollout.n=8",
                                                         "rollout.attention_backend=flashinfer"])
    kw = engine_kwargs(cfg, torch.bfloat16, dp_rank=1, dp=2, gpu=1)
    assert kw["cuda_graph_max_bs_decode"] == 256 and kw["attention_backend"] == "flashinfer"
    assert kw["base_gpu_id"] == 1 and kw["random_seed"] == cfg.trainer.seed + 1 and kw["dtype"] == "bfloat16"
    cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", ["rollout.cuda_graph_max_bs=96", "rollout.micro_batch_size=4"])
    assert engine_kwargs(cfg, torch.float32, 0, 1, 0)["cuda_graph_max_bs_decode"] == 96
    assert kw["enable_fp32_lm_head"] is False
    cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", ["rollout.fp32_lm_head=true"])
    assert engine_kwargs(cfg, torch.bfloat16, 0, 1, 0)["enable_fp32_lm_head"] is True
    with pytest.raises(ValueError, match="rollout.attention_backend: must be one of triton, flashinfer"):
        load_config(f"{ROOT}/configs/tiny_grpo.yaml", ["rollout.attention_backend=fa3"])
