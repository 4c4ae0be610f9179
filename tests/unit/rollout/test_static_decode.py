"""The native engine's static decoder: batch-size buckets (CPU) and, on a GPU, CUDA-graphed decoding
against the same step run eagerly and against megatron's eager inference path.
(The CPU equivalence of the static step with the eager engine is `rollout_worker.check_static_decode_matches_eager`.)"""
import logging

import pytest
import torch

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.heads import lm_output_weight
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout.native import NativeRolloutEngine, unwrap_model
from rlhf_mcore.rollout.static_decode import BUCKETS, StaticDecoder, bucket_for
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.tiny import tiny_model_config


def rollout_gap(model, batch, tp_group) -> torch.Tensor:
    """|rollout log-prob - trainer log-prob| over the response tokens of a rollout batch (the trainer's forward
    of the assembled batch: one right-padded micro-batch, causal)."""
    from rlhf_mcore.models.logprobs import token_logprobs

    with torch.no_grad():
        positions = torch.arange(batch.tokens.size(1), device=batch.tokens.device)[None]
        hidden = model(batch.tokens, positions.expand_as(batch.tokens), None)
        logp, _ = token_logprobs(model, hidden, batch.tokens, tp_group)
    cols = torch.arange(batch.tokens.size(1), device=logp.device)[None]
    start = batch.prompt_lengths[:, None]
    mask = (cols >= start) & (cols < start + batch.response_lengths[:, None])
    return (logp - batch.rollout_logprobs).abs()[mask]


def test_buckets_cover_every_batch_size():
    for n in range(1, 2100):
        b = bucket_for(n)
        assert b >= n and (b in BUCKETS or b % 256 == 0)
        assert bucket_for(b) == b
    assert [bucket_for(n) for n in (1, 5, 33, 512, 513)] == [1, 8, 48, 512, 768]


def test_cpu_falls_back_to_eager_and_says_why(mcore_ctx, caplog):
    if torch.cuda.is_available():
        pytest.skip("CPU path")
    cfg = tiny_model_config()
    actor = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    with caplog.at_level(logging.INFO):
        engine = NativeRolloutEngine(actor, mcore_ctx, pad_id=0)
    assert engine.static is None
    assert "CUDA graphs unavailable (no CUDA device" in caplog.text


def _falls_back(ctx, caplog, failing: dict, plain: dict):
    """Two static decoders of one tiny actor (eager steps): `failing` (StaticDecoder options that raise at the
    first step) and `plain`. Greedy tokens and log-probs must be equal; returns the first decoder, which
    fell back, and the warnings logged."""
    cfg = tiny_model_config(num_layers=2)
    actor = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, ctx)
    engines = [NativeRolloutEngine(actor, ctx, pad_id=0) for _ in range(2)]
    for engine, options in zip(engines, (failing, plain)):
        engine.static = StaticDecoder(engine.model, lambda: lm_output_weight(actor), use_graphs=False, **options)
    params = SamplingParams(n=2, max_new_tokens=6, temperature=0.0)
    with caplog.at_level(logging.WARNING):
        got = engines[0].generate([[3, 4, 5], [7, 8]], params)
    want = engines[1].generate([[3, 4, 5], [7, 8]], params)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.rollout_logprobs, want.rollout_logprobs)
    return engines[0].static, caplog.text


def test_compile_failure_falls_back_to_eager_and_says_so(mcore_ctx, caplog):
    """A compiler error at the first decode step: the log says so and the tokens are the eager ones."""
    def broken(graph_module, example_inputs):
        raise RuntimeError("no compiler here")

    static, text = _falls_back(mcore_ctx, caplog, {"compile_backend": broken}, {"compile_backend": None})
    assert "torch.compile" in text and "decoding with the eager functions" in text
    assert static.fns.backend is None


def test_attention_kernel_failure_falls_back_to_sdpa_and_says_so(mcore_ctx, caplog):
    """The triton decode attention raising inside its kernel module (here: triton absent on CPU, so the
    kernel's first triton call raises): the log says so, the step retries with sdpa, tokens equal an sdpa
    engine's."""
    if torch.cuda.is_available():
        pytest.skip("CPU path: the kernel cannot run without a GPU or the triton interpreter")
    from rlhf_mcore.kernels import decode_attention as kernel

    if kernel.HAS_TRITON:
        pytest.skip("triton is importable: the kernel would run under its interpreter only")
    static, text = _falls_back(mcore_ctx, caplog, {"attention": "triton"}, {"attention": "sdpa"})
    assert "the triton decode attention failed" in text and "using sdpa" in text
    assert static.attention_name == "sdpa"


def _engines(ctx, dtype: str):
    cfg = tiny_model_config(hidden_size=128, ffn_hidden_size=256, num_layers=3, vocab_size=1000, dtype=dtype)
    actor = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, ctx)
    graphed = NativeRolloutEngine(actor, ctx, pad_id=0, cuda_graphs=True)
    eager_static = NativeRolloutEngine(actor, ctx, pad_id=0, cuda_graphs=True)
    eager_static.static = StaticDecoder(actor, lambda: lm_output_weight(actor), use_graphs=False,
                                        compile_backend=graphed.static.fns.backend,
                                        attention=graphed.static.attention_name)  # the same (compiled) step
    megatron = NativeRolloutEngine(actor, ctx, pad_id=0, cuda_graphs=False)
    return graphed, eager_static, megatron


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_graphed_greedy_equals_eager(mcore_ctx, dtype):
    """Greedy tokens: graphed == the same step eager (bitwise, log-probs too); == megatron's eager path in
    fp32 (other attention kernels: tokens exact, log-probs to 1e-4). Ragged prompts, stop tokens (slot
    compaction into smaller buckets) and a second call (graph reuse) included."""
    graphed, eager_static, megatron = _engines(mcore_ctx, dtype)
    assert graphed.static is not None and graphed.static.use_graphs
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 20, (37,), generator=g)
    prompts = [torch.randint(1, 1000, (int(n),), generator=g).tolist() for n in lengths]
    plain = SamplingParams(n=2, max_new_tokens=24, temperature=0.0)
    first = graphed.generate(prompts, plain)
    stops = tuple({int(first.tokens[i, first.prompt_lengths[i] + k]) for i, k in ((0, 3), (5, 9), (11, 15))})
    for params in (plain, SamplingParams(n=2, max_new_tokens=24, temperature=0.0, stop_token_ids=stops)):
        a, b = graphed.generate(prompts, params), eager_static.generate(prompts, params)
        assert torch.equal(a.tokens, b.tokens) and a.finish_reasons == b.finish_reasons
        assert torch.equal(a.rollout_logprobs, b.rollout_logprobs)
        if dtype == "fp32":
            c = megatron.generate(prompts, params)
            assert torch.equal(a.tokens, c.tokens), (a.tokens != c.tokens).sum()
            torch.testing.assert_close(a.rollout_logprobs, c.rollout_logprobs, atol=1e-4, rtol=0)
    assert len(graphed.static.graphs) >= 2, "stop tokens should have moved decoding to smaller buckets"


@pytest.mark.gpu
def test_graphed_sampling_is_seeded(mcore_ctx):
    graphed, _, megatron = _engines(mcore_ctx, "bf16")
    prompts = [[5, 6, 7, 8]] * 8
    params = SamplingParams(n=4, max_new_tokens=16, temperature=1.0, top_k=50, top_p=0.9, seed=7)
    a, b = graphed.generate(prompts, params), graphed.generate(prompts, params)
    assert torch.equal(a.tokens, b.tokens), "same seed, same samples"
    assert len({tuple(r) for r in a.tokens.tolist()}) > 8, "rows of one prompt differ"
    c = graphed.generate(prompts, SamplingParams(n=4, max_new_tokens=16, temperature=1.0, top_k=50, top_p=0.9, seed=8))
    assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.gpu
def test_graphed_plain_sampling_is_seeded(mcore_ctx):
    """Temperature-only sampling goes through the compiled one-pass head inside the graph."""
    graphed, _, _ = _engines(mcore_ctx, "bf16")
    prompts = [[5, 6, 7, 8]] * 8
    params = SamplingParams(n=4, max_new_tokens=16, temperature=0.8, seed=7)
    a, b = graphed.generate(prompts, params), graphed.generate(prompts, params)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.rollout_logprobs, b.rollout_logprobs)
    assert len({tuple(r) for r in a.tokens.tolist()}) > 8, "rows of one prompt differ"


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_compiled_plain_head_follows_softmax(temperature):
    """The inductor-compiled head (its own in-kernel RNG) samples softmax(logits / T); padded ids never."""
    from rlhf_mcore.rollout.static_decode import DecodeFns

    head = DecodeFns.build("inductor").head
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1], device="cuda")
    weight = torch.cat([probs.log(), torch.full((2,), 50.0, device="cuda")]).unsqueeze(1)  # [V + 2 padded, 1]
    hidden = torch.ones(50_000, 1, device="cuda")
    torch.manual_seed(0)
    tokens, logp = head(hidden @ weight.t(), 4, temperature)
    freq = torch.bincount(tokens, minlength=6).float() / tokens.numel()
    want = torch.softmax(probs.log() / temperature, dim=0)
    torch.testing.assert_close(freq[:4], want, atol=0.01, rtol=0)
    assert freq[4:].sum() == 0
    torch.testing.assert_close(logp, want.log()[tokens], atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_triton_attention_decodes_like_sdpa(mcore_ctx):
    """The graphed step with the split-KV kernel against the same step with SDPA, in bf16: log-probs of the
    same greedy tokens agree to bf16 noise (prefix of equal tokens compared; rounding may flip a near-tie)."""
    cfg = tiny_model_config(hidden_size=128, ffn_hidden_size=256, num_layers=3, vocab_size=1000, dtype="bf16")
    actor = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    runs = {}
    for name in ("triton", "sdpa"):
        engine = NativeRolloutEngine(actor, mcore_ctx, pad_id=0, decode_attention=name)
        assert engine.static.attention_name == name
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(3, 40, (70,), generator=g)
        prompts = [torch.randint(1, 1000, (int(n),), generator=g).tolist() for n in lengths]
        runs[name] = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=32, temperature=0.0))
    a, b = runs["triton"], runs["sdpa"]
    same = (a.tokens == b.tokens).all(dim=1)
    assert same.float().mean() > 0.9, same.float().mean()
    torch.testing.assert_close(a.rollout_logprobs[same], b.rollout_logprobs[same], atol=3e-2, rtol=0)


def _trainer_keys(model, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The rotated keys [s, G, D] each layer's core attention sees in the trainer's forward of one row
    (tokens [s] from column 0, positions 0..s-1)."""
    keys, hooks = [], []
    for layer in model.decoder.layers:
        hooks.append(layer.self_attention.core_attention.register_forward_pre_hook(
            lambda module, args: keys.append(args[1][:, 0])))  # key [s, 1, G, D]
    try:
        with torch.no_grad():
            model(tokens[None], torch.arange(tokens.numel())[None], None)
    finally:
        for h in hooks:
            h.remove()
    return keys


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_static_cache_holds_the_trainers_columns(mcore_ctx, dtype):
    """Ragged prompts: row i's prompt sits at cache slots [0, len_i) and response token t at len_i + t, with
    the keys the trainer's forward of that row computes at those columns (same positions, so the same RoPE):
    the rollout decodes in the trainer's layout, not left-padded to the batch's longest prompt."""
    cfg = tiny_model_config(num_layers=2, dtype=dtype)
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)).eval()
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0)
    engine.static = StaticDecoder(model, lambda: lm_output_weight(model), use_graphs=False)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    batch = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=5, temperature=0.0))
    st = engine.static.state
    tol = {"fp32": 1e-5, "bf16": 2e-2}[dtype]
    for row, prompt in enumerate(prompts):
        fed = len(prompt) + 4  # the last response token is sampled, never fed back
        assert int(st.pos[row]) == fed  # the slot the next token would take: the trainer's next column
        for layer, want in enumerate(_trainer_keys(model, batch.tokens[row, :fed + 1])):
            got = st.k[layer, row, :, :fed].transpose(0, 1)  # [fed, G, D]
            torch.testing.assert_close(got.float(), want[:fed].float(), atol=tol, rtol=0)


def test_attention_over_a_length_bucket_of_the_cache_decodes_the_same(mcore_ctx, monkeypatch):
    """SDPA decode attention reads the cache cut to the written slots rounded up to LENGTH_BLOCK (here 4, so
    the cut moves every few steps): the same tokens and log-probs as reading all of it."""
    from rlhf_mcore.rollout import static_decode

    cfg = tiny_model_config(num_layers=2, dtype="fp32")
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)).eval()
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    params = SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=5)
    runs, lengths = [], []
    for block in (4, 10**6):
        monkeypatch.setattr(static_decode, "LENGTH_BLOCK", block)
        engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0)
        engine.static = StaticDecoder(model, lambda: lm_output_weight(model), use_graphs=False, attention="sdpa")
        step = engine.static.decode_step
        engine.static.decode_step = lambda *args: lengths.append(args[-1]) or step(*args)
        runs.append(engine.generate(prompts, params))
    assert sorted(set(lengths)) == [8, 12, 16, 19], "cut to multiples of 4, then the whole cache (7 + 12 slots)"
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    torch.testing.assert_close(runs[0].rollout_logprobs, runs[1].rollout_logprobs, atol=1e-6, rtol=0)


def biased_llama(ctx, dtype: str, hidden_act: str, **model_fields):
    """A tiny Llama with a bias on every linear (attention_bias + mlp_bias, drawn at random: megatron starts them
    at 0) and `hidden_act`."""
    cfg = tiny_model_config(num_layers=2, dtype=dtype, **model_fields)
    hf = {**load_hf_config(cfg.model), "attention_bias": True, "mlp_bias": True, "hidden_act": hidden_act}
    model = unwrap_model(build_model("actor", hf, cfg.model, cfg.parallel, ctx)).eval()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


@pytest.mark.parametrize("static", [True, False], ids=["static", "eager"])
def test_rollout_logprobs_of_a_biased_geglu_llama_equal_the_trainers(mcore_ctx, static):
    """Biases on every linear and a GeGLU MLP: the functional decode step (eager on CPU) and megatron's eager
    inference path both give the trainer's log-probs (fp32, ragged prompts, sampling)."""
    from rlhf_mcore.rollout.static_decode import graph_blockers

    model = biased_llama(mcore_ctx, "fp32", "gelu_pytorch_tanh")
    assert graph_blockers(model, mcore_ctx) == []
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0)
    engine.static = StaticDecoder(model, lambda: lm_output_weight(model), use_graphs=False) if static else None
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    batch = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=10, temperature=1.0, seed=2))
    gap = rollout_gap(model, batch, mcore_ctx.pgs.tp)
    assert gap.numel() > 0 and gap.max() < 1e-5, gap.max()


@pytest.mark.gpu
@pytest.mark.parametrize("hidden_act", ["silu", "gelu_pytorch_tanh"])
def test_graphed_rollout_logprobs_of_a_biased_llama_equal_the_trainers(mcore_ctx, hidden_act):
    """bf16 on a GPU, graphed: with silu megatron runs its fused SwiGLU with fc1's bias (`bias_swiglu_impl`), the
    decode step calls the same kernel; GeGLU runs unfused on both sides."""
    model = biased_llama(mcore_ctx, "bf16", hidden_act, hidden_size=128, ffn_hidden_size=256, vocab_size=1000)
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0, decode_attention="sdpa")
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 40, (16,), generator=g)
    prompts = [torch.randint(1, 1000, (int(n),), generator=g).tolist() for n in lengths]
    batch = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=64, temperature=1.0, seed=1))
    assert engine.static is not None
    gap = rollout_gap(model, batch, mcore_ctx.pgs.tp)
    print(f"{hidden_act}: mean |rollout - trainer| {gap.mean().item():.3e}, exact {(gap <= 1e-5).float().mean():.3f}")
    assert gap.mean() < 1e-4, gap.mean()


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["sdpa", "triton", "auto"])
def test_graphed_rollout_logprobs_equal_the_trainers_on_ragged_prompts(mcore_ctx, attention):
    """bf16, ragged prompts, sampling: the graphed rollout's log-probs against the trainer's forward of the
    assembled batch (one right-padded micro-batch, causal). With the trainer's layout and SDPA decode attention
    they are the trainer's numbers (over the cache cut to length buckets too: 160 new tokens cross them); the
    split-KV kernel sums in its own order (bf16 noise)."""
    cfg = tiny_model_config(hidden_size=128, ffn_hidden_size=256, num_layers=3, vocab_size=1000, dtype="bf16")
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)).eval()
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0, decode_attention=attention)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 60, (48,), generator=g)
    prompts = [torch.randint(1, 1000, (int(n),), generator=g).tolist() for n in lengths]
    batch = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=160, temperature=1.0, seed=1))
    gap = rollout_gap(model, batch, mcore_ctx.pgs.tp)
    picked = engine.static.attention_name  # auto: sdpa where the probe finds it exact (an H200), else triton
    print(f"{attention} ({picked}): mean |rollout - trainer| {gap.mean().item():.3e}, "
          f"exact {(gap <= 1e-5).float().mean():.3f}")
    assert gap.mean() < {"sdpa": 1e-4, "triton": 3e-3}[picked], gap.mean()


def _tiny_bf16_engine(mcore_ctx, **kw):
    cfg = tiny_model_config(hidden_size=128, ffn_hidden_size=256, num_layers=2, vocab_size=1000, dtype="bf16")
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)).eval()
    return model, NativeRolloutEngine(model, mcore_ctx, pad_id=0, decode_attention="sdpa", **kw)


@pytest.mark.gpu
def test_hundreds_of_stop_ids_are_captured_and_rows_stop_at_them(mcore_ctx):
    """250 stop ids (torch.isin would sort and call unique, which waits on the host: the capture failed and left
    CUDA's generator unusable): the graphed rollout ends rows at them, its log-probs the trainer's."""
    model, graphed = _tiny_bf16_engine(mcore_ctx)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    params = SamplingParams(n=2, max_new_tokens=24, temperature=1.0, seed=4, stop_token_ids=tuple(range(1, 1000, 4)))
    batch = graphed.generate(prompts, params)
    assert graphed.static.graphs, "no graph was captured"
    ends = batch.tokens.gather(1, (batch.prompt_lengths + batch.response_lengths - 1)[:, None])[:, 0]
    stopped = batch.response_lengths < 24
    assert stopped.any() and bool((ends[stopped] % 4 == 1).all())
    assert rollout_gap(model, batch, mcore_ctx.pgs.tp).mean() < 1e-4
    torch.rand(4, device="cuda")  # CUDA's generator still draws outside a graph


@pytest.mark.gpu
def test_a_decode_step_that_waits_on_the_host_turns_graphs_off_before_any_capture(mcore_ctx, monkeypatch, caplog):
    """A step with a host sync (here an `.item()` in the emit) fails its checked warm-up, not a capture: graphs
    go off with a warning, the rollout decodes eagerly and matches the trainer, and CUDA's generator works."""
    model, engine = _tiny_bf16_engine(mcore_ctx)
    emit = StaticDecoder.emit
    monkeypatch.setattr(StaticDecoder, "emit", lambda self, hidden, *a, **k: (hidden.sum().item(),
                                                                              emit(self, hidden, *a, **k)))
    with caplog.at_level(logging.WARNING):
        batch = engine.generate([[5, 6, 7], [8, 9]], SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=1))
    assert "decoding without CUDA graphs" in caplog.text and not engine.static.use_graphs
    assert not engine.static.graphs
    assert rollout_gap(model, batch, mcore_ctx.pgs.tp).mean() < 1e-4
    torch.rand(4, device="cuda")
