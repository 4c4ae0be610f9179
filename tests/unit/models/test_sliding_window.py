"""Sliding-window attention (Mistral's `sliding_window`; Qwen2 / Qwen3's `use_sliding_window` on the layers
`layer_types` / `max_window_layers` pick): transformers' logits at 32 tokens with a window of 8, padded and packed,
at TP1 (TP2 / PP2: tests/dist/models/test_hf_layouts.py), and the native decoder's log-probs (static functional
decoder and megatron's eager KV cache) equal to the trainer's over responses that run past the window."""
import pytest
import torch

from rlhf_mcore.models.hf_load import load_hf_weights
from tests.support.tiny_hf import save_tiny

CASES = ("qwen3_window", "qwen2_window", "mistral_window")
WINDOWS = {"qwen3_window": [None, None, 8, 8], "qwen2_window": [None, 8, 8, 8], "mistral_window": [8] * 4}
SEQ = 32


@pytest.fixture(scope="module", params=CASES)
def case(request, tmp_path_factory, mcore_ctx):
    """(case, HF dir, our fp32 model with the HF weights)."""
    from rlhf_mcore.convert.mcore import build_for_conversion
    from rlhf_mcore.models.hf_io import read_hf_config

    hf_dir = save_tiny(tmp_path_factory.mktemp(request.param) / "hf", request.param)
    hf_cfg = read_hf_config(hf_dir)
    model = build_for_conversion(hf_cfg, "actor", mcore_ctx, "fp32")
    load_hf_weights(model, str(hf_dir), hf_cfg, 0, 1)
    return request.param, hf_dir, model.eval()


def _hf_logits(hf_dir, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(tokens).logits  # [B, S, V]


def _tokens(rows: int = 2, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(3, 250, (rows, seq), generator=torch.Generator().manual_seed(0))


def test_layers_slide_as_transformers_says(case):
    name, _, model = case
    assert [layer.self_attention.core_attention.window for layer in model.decoder.layers] == WINDOWS[name]


def test_logits_match_transformers_past_the_window(case, mcore_ctx):
    from rlhf_mcore.models.logprobs import full_logits

    name, hf_dir, model = case
    tokens = _tokens()
    pos = torch.arange(SEQ).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        ours = full_logits(model, model(tokens, pos, None), mcore_ctx.pgs.tp)
    err = (ours - _hf_logits(hf_dir, tokens)).abs().max().item()
    print(f"{name} padded logits at seq {SEQ}, window 8: max |ours - transformers| = {err:.2e}")
    assert err <= 1e-5


def test_packed_logits_match_transformers_past_the_window(case, mcore_ctx):
    """Sequences of 32, 5 and 20 tokens packed in one row: each gets transformers' logits of it alone."""
    from rlhf_mcore.models.logprobs import full_logits
    from rlhf_mcore.models.packed import packed_seq_params

    name, hf_dir, model = case
    lengths, full = [SEQ, 5, 20], _tokens(3)
    tokens = torch.cat([full[i, :n] for i, n in enumerate(lengths)]).unsqueeze(0)  # [1, T]
    mb = {"cu_seqlens": torch.tensor([0, 32, 37, 57], dtype=torch.int32), "max_seqlen": SEQ,
          "position_ids": torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)}
    with torch.no_grad():
        hidden = model(tokens, mb["position_ids"], None, packed_seq_params=packed_seq_params(mb, "sbhd"))
        ours = full_logits(model, hidden, mcore_ctx.pgs.tp)[0]  # [T, V]
    want = _hf_logits(hf_dir, full)
    err = max((ours[start:start + n] - want[i, :n]).abs().max().item()
              for i, (start, n) in enumerate(zip([0, 32, 37], lengths)))
    print(f"{name} packed logits, window 8: max |ours - transformers| = {err:.2e}")
    assert err <= 1e-5


@pytest.mark.parametrize("path", ["static", "eager"])
def test_native_decode_equals_the_trainers_forward_past_the_window(case, mcore_ctx, path):
    """Prompts of 12 and 3 tokens, 14 new tokens each: both rows attend past the window of 8 while decoding."""
    from rlhf_mcore.models.heads import lm_output_weight
    from rlhf_mcore.models.logprobs import token_logprobs
    from rlhf_mcore.rollout.native import NativeRolloutEngine
    from rlhf_mcore.rollout.static_decode import StaticDecoder
    from rlhf_mcore.rollout.types import SamplingParams

    name, hf_dir, model = case
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0)
    if path == "static":  # the functional decoder the GPU runs graphed, here its eager steps
        engine.static = StaticDecoder(engine.model, lambda: lm_output_weight(model), use_graphs=False)
    prompts = [list(range(3, 15)), [7, 8, 9]]
    batch = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=14, temperature=0.0))
    with torch.no_grad():
        pos = torch.arange(batch.tokens.size(1))[None].expand_as(batch.tokens)
        logp, _ = token_logprobs(model, model(batch.tokens, pos, None), batch.tokens, mcore_ctx.pgs.tp)
    cols = torch.arange(batch.tokens.size(1))[None]
    start = batch.prompt_lengths[:, None]
    mask = (cols >= start) & (cols < start + batch.response_lengths[:, None])
    gap = (logp - batch.rollout_logprobs).abs()[mask].max().item()
    hf_logp = torch.log_softmax(_hf_logits(hf_dir, batch.tokens)[:, :-1], -1).gather(-1, batch.tokens[:, 1:, None])
    hf_gap = (logp[:, 1:] - hf_logp[..., 0]).abs()[mask[:, 1:]].max().item()  # the trainer's are transformers'
    print(f"{name} {path} decode: max |rollout - trainer| log-prob = {gap:.2e}, |trainer - transformers| = "
          f"{hf_gap:.2e}")
    assert mask.sum() == 2 * 14 and gap <= 1e-5 and hf_gap <= 1e-5
