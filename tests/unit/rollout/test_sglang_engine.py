"""The embedded SGLang engine: what can be checked without a GPU (the weights it starts from are the
actor's, reproduced by transformers; the weight refresh and generation around a stand-in server; response
post-processing; the fit check; clear errors), and on a GPU the engine itself against the trainer.
The split over TP x PP ranks and the TP/PP weight gather run at 2-4 ranks in
tests/dist/rollout/test_native.py (CPU) and tests/dist/rollout/test_engine_layouts.py (GPU)."""
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlhf_mcore.config import SGLangRolloutConfig
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.full_weights import FullWeights, hf_weights, num_params
from rlhf_mcore.models.logprobs import full_logits
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout.base import EngineSetup
from rlhf_mcore.rollout.responses import Response
from rlhf_mcore.rollout.sglang_engine import (
    SGLangRolloutEngine,
    check_supported,
    cut_at_stop_string,
    to_response,
    write_hf_dir,
)
from rlhf_mcore.rollout.sglang_weights import FLATTENED, unflatten_bucket
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.tiny import tiny_model_config


def encode_flat(flat, entries):
    """What the stand-in server takes for a flat bucket (on a GPU: `sglang_weights.sglang_payload`)."""
    return flat.clone(), entries


def setup_for(actor, hf, ctx, **overrides) -> EngineSetup:
    fields = dict(model=actor, hf_config=hf, ctx=ctx, pad_id=0, decode=None, micro_batch_size=0, replica_rows=16,
                  seed=1)
    return EngineSetup(**{**fields, **overrides})


class StandIn:
    """What the engine calls on an sglang.Engine, recorded (generate answers `prompt[-1] + 1` twice; a flat
    bucket, encoded by `encode_flat`, is read back as SGLang's loader reads it)."""

    def __init__(self):
        self.calls, self.flushes, self.prompts, self.prefills, self.formats = [], 0, [], [], []

    def update_weights_from_tensor(self, named, load_format=None, flush_cache=True):
        if load_format == FLATTENED:
            named = unflatten_bucket(*named)
        self.formats.append(load_format)
        self.calls.append(([(n, t.clone()) for n, t in named], flush_cache))
        return True, "Success"

    def flush_cache(self):
        self.flushes += 1

    def generate(self, input_ids, sampling_params, return_logprob):
        if sampling_params["max_new_tokens"] == 0:  # a prefill into the prefix cache: no output kept
            self.prefills.append(input_ids)
            return [{"output_ids": [], "meta_info": {"finish_reason": {"type": "length"}}} for _ in input_ids]
        self.prompts.append(input_ids)
        return [{"output_ids": [p[-1] + 1, p[-1] + 2], "meta_info": {
            "finish_reason": {"type": "length"}, "output_token_logprobs": [(-0.5, 0, None), (-0.25, 0, None)]}}
            for p in input_ids]


def test_engine_starts_from_the_actors_weights(mcore_ctx, tmp_path):
    """The HF directory handed to SGLang computes exactly what our actor computes (checked in transformers)."""
    cfg = tiny_model_config(tie_embeddings=True)
    hf = load_hf_config(cfg.model)
    actor = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    path = write_hf_dir(hf_weights(FullWeights(actor, mcore_ctx), hf), hf, torch.float32)
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
def test_needs_a_gpu():
    with pytest.raises(ValueError, match="rollout.engine: sglang needs a CUDA GPU"):
        check_supported()


@pytest.mark.parametrize("encode", [encode_flat, None], ids=["flat-buckets", "tensors"])
def test_weight_refresh_in_buckets_with_one_flush(mcore_ctx, encode):
    """update_weights sends every HF tensor exactly once, equal to the converter's, in buckets of at most
    weight_bucket_mb (a larger tensor alone), each one flat tensor (SGLang's flattened_bucket format) or
    tensor by tensor, then flushes the prefix cache once; it reports the bytes."""
    from rlhf_mcore.convert.mcore import full_state_dict
    from rlhf_mcore.models.weights import mcore_to_hf

    cfg = tiny_model_config(tie_embeddings=True)
    hf = load_hf_config(cfg.model)
    actor = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    engine = SGLangRolloutEngine(setup_for(actor, hf, mcore_ctx), 40_000, StandIn(), encode=encode)
    metrics = engine.update_weights(actor)
    assert set(engine.engine.formats) == {FLATTENED if encode else None}
    want = mcore_to_hf(full_state_dict(actor), hf, role="actor")
    sent = [pair for named, _ in engine.engine.calls for pair in named]
    assert [n for n, _ in sent] == list(want) and all(torch.equal(t, want[n]) for n, t in sent)
    assert [flush for _, flush in engine.engine.calls] == [False] * len(engine.engine.calls)
    assert engine.engine.flushes == 1 and len(engine.engine.calls) > 2
    for named, _ in engine.engine.calls:
        size = sum(t.numel() * t.element_size() for _, t in named)
        assert size <= engine.bucket_bytes or len(named) == 1
    assert metrics == {"perf/weight_sync_gb": sum(t.numel() * 4 for t in want.values()) / 1e9,
                       "perf/weight_reshard_gb": 0.0}


def test_resume_returns_the_trainers_cache_to_the_device_first(mcore_ctx, monkeypatch):
    """On the H200 the update's ~30 GiB of free cache stayed reserved beside SGLang's whole memory fraction (the
    memory plan's SGLang rows measured 1.3-1.4x): the engine's scheduler is another process, so the trainer's free
    blocks go back to the device before the engine takes its memory back."""
    cfg = tiny_model_config()
    hf = load_hf_config(cfg.model)
    actor = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    order = []

    class Server(StandIn):
        def resume_memory_occupation(self):
            order.append("resume")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("empty_cache"))
    SGLangRolloutEngine(setup_for(actor, hf, mcore_ctx), 1 << 20, Server()).resume_memory()
    assert order == ["empty_cache", "resume"]


def test_generate_expands_samples_and_cuts_stop_strings(mcore_ctx):
    """One rank: every row (prompt x n) goes to the server once, in order; stop strings cut after generation."""
    cfg = tiny_model_config()
    hf = load_hf_config(cfg.model)
    actor = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    decode = lambda ids: "".join(chr(96 + i) for i in ids)  # noqa: E731
    engine = SGLangRolloutEngine(setup_for(actor, hf, mcore_ctx, decode=decode), 1 << 20, StandIn())
    batch = engine.generate([[1, 2], [5]], SamplingParams(n=2, max_new_tokens=2, stop_strings=("f",)))
    assert engine.engine.prefills == [[[1, 2], [5]]]  # each prompt prefilled once, into the prefix cache
    assert engine.engine.prompts == [[[1, 2], [1, 2], [5], [5]]]
    assert batch.tokens.tolist() == [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 0, 0], [5, 6, 0, 0]]
    assert batch.finish_reasons == ["length", "length", "stop", "stop"]
    assert batch.response_lengths.tolist() == [2, 2, 1, 1]
    engine.generate([[1, 2], [5]], SamplingParams(n=1, max_new_tokens=2))
    assert len(engine.engine.prefills) == 1  # no prompt shared by two rows: nothing to prefill first


def test_engine_arguments_follow_the_options(mcore_ctx):
    """Decode CUDA graphs cover this GPU's share of its replica's rows unless set; the backend is the key's."""
    from rlhf_mcore.rollout.sglang_engine import engine_kwargs

    setup = setup_for(None, {}, mcore_ctx, replica_rows=256, seed=7)
    kw = engine_kwargs(SGLangRolloutConfig(attention_backend="flashinfer"), setup, torch.bfloat16, gpu=1)
    assert kw["cuda_graph_max_bs_decode"] == 256 and kw["attention_backend"] == "flashinfer"
    assert kw["base_gpu_id"] == 1 and kw["random_seed"] == 7 + mcore_ctx.rank and kw["dtype"] == "bfloat16"
    small = setup_for(None, {}, mcore_ctx, micro_batch_size=4)
    assert engine_kwargs(SGLangRolloutConfig(), small, torch.float32, 0)["cuda_graph_max_bs_decode"] == 4
    assert engine_kwargs(SGLangRolloutConfig(cuda_graph_max_bs=96), small, torch.float32, 0)[
        "cuda_graph_max_bs_decode"] == 96
    assert kw["enable_fp32_lm_head"] is False
    assert engine_kwargs(SGLangRolloutConfig(fp32_lm_head=True), small, torch.bfloat16, 0)["enable_fp32_lm_head"]


def test_fit_check_counts_the_models_parameters():
    """num_params is the HF model's parameter count (transformers builds it); a model that cannot fit one
    GPU for inference gets one error with the estimate and the fix, before anything is built."""
    hf = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64,
          "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
          "tie_word_embeddings": False, "max_position_embeddings": 128}
    theirs = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf))
    assert num_params(hf) == sum(p.numel() for p in theirs.parameters())
    options = SGLangRolloutConfig(gpu_memory_utilization=0.5)
    assert SGLangRolloutEngine.memory_errors(options, 10**9, 2, 4 * 2**30, 0) == []
    (err,) = SGLangRolloutEngine.memory_errors(options, 10**9, 2, 2**30, 2**28)
    assert err.startswith("rollout.engine: sglang keeps the whole model on every GPU and needs 2.1 GiB")
    assert "The model does not fit one GPU for inference: use rollout.engine=native" in err
    (err,) = SGLangRolloutEngine.memory_errors(options, 10**9, 2, 3 * 2**30, 0)
    assert "Raise rollout.sglang.gpu_memory_utilization to at least 0.63" in err


@pytest.mark.gpu
def test_sglang_engine_matches_the_trainer_and_follows_weight_updates(mcore_ctx):
    """Engine log-probs agree with the trainer's recomputation (bf16 kernels differ: mean |diff| < 0.02),
    and after update_weights the engine samples from the new weights."""
    from rlhf_mcore.models.logprobs import token_logprobs

    cfg = tiny_model_config(hidden_size=256, ffn_hidden_size=512, num_attention_heads=4, num_query_groups=2,
                            vocab_size=258, dtype="bf16")
    hf = load_hf_config(cfg.model)
    actor = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    engine = SGLangRolloutEngine.build(SGLangRolloutConfig(gpu_memory_utilization=0.3),
                                       setup_for(actor, hf, mcore_ctx, pad_id=257))
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
    check_abort_and_continue(engine, actor, mcore_ctx, prompts)
    with torch.no_grad():
        actor.output_layer.weight.mul_(3.0)  # a sharper policy: log-probs change a lot
    engine.release_memory()
    engine.resume_memory()
    engine.update_weights(actor)
    after, _ = mismatch()
    assert after < 0.05, after  # the engine now samples from the updated weights
    engine.shutdown()


def check_abort_and_continue(engine, actor, ctx, prompts) -> None:
    """Partial rollouts through SGLang itself: 24 rows through 8 requests in flight, stopped once 6 have ended. The
    rows in flight come back aborted with what they decoded so far (tokens with their log-probs); continuing them
    from prompt + prefix finishes them; every token's log-prob agrees with the trainer's as the sync path's do."""
    from rlhf_mcore.models.logprobs import token_logprobs

    assert engine.continuous
    rows = [p for p in prompts for _ in range(3)]
    params = SamplingParams(n=1, max_new_tokens=64, temperature=1.0, stop_token_ids=(256,))
    ended = {}

    def on_finish(i, response):
        ended[i] = response
        return len(ended) >= 6
    cut = engine.generate_continuous(rows, [64] * 24, params, on_finish, num_slots=8)
    assert len(ended) >= 6 and cut and not set(cut) & set(ended) and len(ended) + len(cut) <= 24
    assert all(r.finish_reason == "abort" and len(r.tokens) == len(r.logprobs) < 64 for r in cut.values())
    assert any(r.tokens for r in cut.values()), "requests in flight kept what they had decoded"
    rest = {}
    engine.generate_continuous([rows[i] + cut[i].tokens for i in cut], [64 - len(cut[i].tokens) for i in cut], params,
                               lambda j, r: rest.setdefault(j, r) and False, num_slots=8)
    whole = {i: (cut[i].tokens + rest[j].tokens, cut[i].logprobs + rest[j].logprobs) for j, i in enumerate(cut)}
    whole.update({i: (r.tokens, r.logprobs) for i, r in ended.items()})
    assert all(rest[j].finish_reason in ("stop", "length") for j in range(len(cut)))
    gaps = []
    with torch.no_grad():
        for i, (tokens, logprobs) in whole.items():
            ids = torch.tensor([rows[i] + tokens], device=ctx.device)
            pos = torch.arange(ids.size(1), device=ctx.device).unsqueeze(0)
            logp, _ = token_logprobs(actor, actor(ids, pos, None), ids, ctx.pgs.tp)
            gaps += (logp[0, len(rows[i]):] - torch.tensor(logprobs, device=ctx.device)).abs().tolist()
    assert sum(gaps) / len(gaps) < 0.02, sum(gaps) / len(gaps)


def test_start_up_check_asks_the_engine_whether_the_model_fits(monkeypatch):
    """preflight (rank 0, before any model is built) stops an sglang run whose model cannot fit one GPU; the
    native engine keeps no copy of its own. The GPU is faked: 1 MiB of memory."""
    import types

    from rlhf_mcore.config.load import load_config
    from rlhf_mcore.trainer import preflight
    from tests.support.paths import ROOT_STR as ROOT

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=2**20))
    monkeypatch.setattr("rlhf_mcore.config.environment.importable", lambda module: True)  # sglang need not be there
    cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", ["rollout.engine=sglang"])
    (err,) = preflight._engine_memory_errors(cfg)
    assert err.startswith("rollout.engine: sglang keeps the whole model on every GPU")
    assert "of this 0.000977 GiB GPU" in err
    assert preflight._engine_memory_errors(load_config(f"{ROOT}/configs/tiny_grpo.yaml")) == []
