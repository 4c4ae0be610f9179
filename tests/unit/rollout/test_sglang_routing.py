"""R3 through SGLang (`rollout/sglang_routing.py`): SGLang's routed experts (meta_info["routed_experts"], base64 of
int32 [prompt + output - 1, all HF layers, top-k]) become the native recorder's layout ([prompt + response, this
rank's MoE layers, k], the row's last token at experts 0..k-1). On CPU: a hand-built example, and the engine around
a stand-in server that answers with the experts the trainer's own forward chooses. On a GPU: the engine itself
against the trainer (tiny Qwen3-MoE GRPO with R3 on SGLang: tests/dist/rollout/test_sglang_r3.py)."""
import base64

import pytest
import torch

from rlhf_mcore.models.routing import RoutingHooks
from rlhf_mcore.rollout.base import EngineSetup
from rlhf_mcore.rollout.sglang_engine import SGLangRolloutEngine, engine_kwargs
from rlhf_mcore.rollout.sglang_routing import SGLangRouting, decode_routed_experts, row_routing
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.trainer.schedule import forward_collect, split_micro_batches
from tests.support.tiny_moe import EXPERTS, NUM_LAYERS, TOPK, gpu_moe_dir, load_tiny_moe


def as_sglang(routing: torch.Tensor) -> str:
    """[n, layers, k] -> what SGLang puts in meta_info["routed_experts"]."""
    return base64.b64encode(routing.to(torch.int32).numpy().tobytes()).decode()


def test_a_hand_built_request_in_our_layout():
    """3 HF layers, top-2, 32 experts; a 3-token prompt and 2 response tokens: SGLang returns 4 tokens (the last
    response token is never fed). Token t, layer l, slot j holds expert 6t + 2l + j (distinct everywhere, so any
    mix-up of token, layer or top-k order shows); this rank (a PP stage) owns HF layers 0 and 2."""
    tokens, layers, k = 4, 3, 2
    flat = torch.tensor([[[6 * t + 2 * layer + j for j in range(k)] for layer in range(layers)] for t in range(tokens)])
    flat[:, 2] = flat[:, 2].flip(-1)  # the router's own top-k order is kept as it is
    decoded = decode_routed_experts(as_sglang(flat), num_layers=layers, topk=k)
    assert decoded.dtype == torch.int32 and torch.equal(decoded, flat.int())
    routing = SGLangRouting(num_layers=layers, topk=k, num_experts=32, layers=[0, 2])
    row = routing.this_rank(row_routing(decoded, prompt_len=3, num_tokens=2, num_experts=32))
    assert row.shape == (5, 2, 2) and row.dtype == torch.uint8
    assert row[:4, 0].tolist() == flat[:, 0].tolist()  # prompt tokens 0-2, then response token 0 (position 3)
    assert row[:4, 1].tolist() == flat[:, 2].tolist()
    assert row[4].tolist() == [[0, 1], [0, 1]]  # the last response token: experts 0..k-1, as the native recorder
    cut = row_routing(decoded, prompt_len=3, num_tokens=1, num_experts=32)  # a stop string cut the response
    assert cut.shape == (4, 3, 2) and torch.equal(cut[:3], flat[:3].to(torch.uint8))
    assert routing.this_rank(cut) is not None and SGLangRouting(3, 2, 32, []).this_rank(cut) is None


def test_routing_that_cannot_be_ours_is_refused():
    flat = torch.zeros(2, 3, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="2 tokens of routing for a row that fed 4"):
        row_routing(flat, prompt_len=3, num_tokens=2, num_experts=16)
    with pytest.raises(RuntimeError, match="expert ids outside 0..15"):
        row_routing(flat + 16, prompt_len=2, num_tokens=1, num_experts=16)
    with pytest.raises(ValueError, match="not a whole number of tokens of 3 layers x top-2"):
        decode_routed_experts(as_sglang(torch.zeros(5, dtype=torch.int32)), num_layers=3, topk=2)
    with pytest.raises(RuntimeError, match="enable_return_routed_experts=True"):
        SGLangRouting(3, 2, 16, [0]).row({"meta_info": {}}, 2, 1)


@pytest.fixture(scope="module")
def moe(tmp_path_factory, mcore_ctx):
    from rlhf_mcore.models.hf_io import read_hf_config

    directory = tmp_path_factory.mktemp("moe")
    model = load_tiny_moe(directory, mcore_ctx)
    return model, read_hf_config(str(directory))


def trainer_routing(model, ctx, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, S, L, k] the experts the trainer's forward chooses for the rows."""
    b, s = tokens.shape

    def no_loss(mb, output, non_loss_data=True):
        return {"logp": torch.zeros(mb["tokens"].shape, device=mb["tokens"].device)}
    with RoutingHooks([model], record_shape=(b, s)) as hooks, torch.no_grad():
        forward_collect([model], split_micro_batches({"tokens": tokens, "lengths": lengths}, micro_batch_size=2),
                        no_loss, ("logp",), s, ctx.pgs.pp, hooks=hooks)
    return hooks.recorded


class RoutingStandIn:
    """An sglang.Engine stand-in that answers each request with 3 tokens and the experts our own model chooses for
    its prompt + output tokens but the last, as SGLang returns them (every HF layer, int32, base64)."""

    def __init__(self, model, ctx):
        self.model, self.ctx, self.requests = model, ctx, []

    def generate(self, input_ids, sampling_params, return_logprob, return_routed_experts=False):
        if sampling_params["max_new_tokens"] == 0:
            return [{"output_ids": [], "meta_info": {"finish_reason": {"type": "length"}}} for _ in input_ids]
        self.requests.append(return_routed_experts)
        outs = []
        for prompt in input_ids:
            ids = prompt + [(prompt[-1] + i) % 250 + 1 for i in range(1, 4)]
            seen = torch.tensor([ids[:-1]])
            routed = trainer_routing(self.model, self.ctx, seen, torch.tensor([seen.size(1)]))[0]  # [n, L, k]
            outs.append({"output_ids": ids[len(prompt):], "meta_info": {
                "finish_reason": {"type": "length"}, "output_token_logprobs": [(-0.5, t, None) for t in ids[-3:]],
                "routed_experts": as_sglang(routed)}})
        return outs


def test_the_engine_returns_the_experts_in_the_trainers_layout(moe, mcore_ctx):
    """Rows of different prompt lengths (padding after the shorter ones), one response cut by a stop string: the
    batch's routed_experts equal the trainer's routing of the assembled rows at every fed token, and hold experts
    0..k-1 at each row's last token and the padding."""
    model, hf = moe
    setup = EngineSetup(model=model, hf_config=hf, ctx=mcore_ctx, pad_id=0, decode=lambda ids: "x" * (9 in ids),
                        micro_batch_size=0, replica_rows=6, seed=1, record_routing=True)
    assert engine_kwargs(_options(), setup, torch.bfloat16, gpu=0)["enable_return_routed_experts"] is True
    engine = SGLangRolloutEngine(setup, 1 << 20, RoutingStandIn(model, mcore_ctx))
    prompts = [[5, 6, 7, 8, 9], [12, 13], [6]]  # [6] answers 8, 9, 10: cut after 9 by the stop string "x"
    batch = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=3, stop_strings=("x",)))
    assert engine.engine.requests == [True]
    b, s = batch.tokens.shape
    assert batch.routed_experts.shape == (b, s, NUM_LAYERS, TOPK) and batch.routed_experts.dtype == torch.uint8
    assert batch.response_lengths.tolist() == [3, 3, 3, 3, 2, 2] and s == 8
    expected = trainer_routing(model, mcore_ctx, batch.tokens, batch.total_lengths)
    known = torch.arange(s)[None] < batch.total_lengths[:, None] - 1
    assert torch.equal(batch.routed_experts[known], expected[known])
    assert (batch.routed_experts[~known] == torch.arange(TOPK, dtype=torch.uint8)).all()
    assert int(batch.routed_experts.max()) < EXPERTS


def test_without_r3_the_engine_asks_for_no_experts(moe, mcore_ctx):
    model, hf = moe
    setup = EngineSetup(model=model, hf_config=hf, ctx=mcore_ctx, pad_id=0, decode=None, micro_batch_size=0,
                        replica_rows=2, seed=1)
    assert "enable_return_routed_experts" not in engine_kwargs(_options(), setup, torch.bfloat16, gpu=0)
    engine = SGLangRolloutEngine(setup, 1 << 20, RoutingStandIn(model, mcore_ctx))
    assert engine.generate([[5, 6]], SamplingParams(n=2, max_new_tokens=3)).routed_experts is None
    assert engine.engine.requests == [False]


def _options():
    from rlhf_mcore.config import SGLangRolloutConfig

    return SGLangRolloutConfig()



@pytest.mark.gpu
def test_sglang_returns_the_experts_the_trainer_chooses(tmp_path, mcore_ctx):
    """bf16 tiny Qwen3-MoE through the real engine: its routing agrees with the trainer's own at >= 90% of the
    token x layer top-k sets (bf16 kernels part on near ties), and replaying it brings the trainer's log-probs
    at least as close to the sampler's as routing freely does."""
    pytest.importorskip("sglang")
    from rlhf_mcore.config import ModelConfig, ParallelConfig, SGLangRolloutConfig
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.logprobs import token_logprobs
    from rlhf_mcore.models.transformer_config import load_hf_config

    model_cfg = ModelConfig(hf_path=gpu_moe_dir(tmp_path / "hf"), init="random", dtype="bf16")
    hf = load_hf_config(model_cfg)
    actor = build_model("actor", hf, model_cfg, ParallelConfig(), mcore_ctx)
    setup = EngineSetup(model=actor, hf_config=hf, ctx=mcore_ctx, pad_id=257, decode=None, micro_batch_size=0,
                        replica_rows=16, seed=1, record_routing=True)
    engine = SGLangRolloutEngine.build(SGLangRolloutConfig(gpu_memory_utilization=0.3), setup)
    prompts = torch.randint(0, 256, (8, 12), generator=torch.Generator().manual_seed(0)).tolist()
    batch = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=24, temperature=1.0, stop_token_ids=(256,)))
    engine.shutdown()
    tokens, lengths, routed = batch.tokens, batch.total_lengths, batch.routed_experts
    assert routed.shape == (*tokens.shape, 2, 2) and routed.device == tokens.device
    known = torch.arange(tokens.size(1), device=tokens.device)[None] < lengths[:, None] - 1
    free = trainer_routing(actor, mcore_ctx, tokens, lengths)
    same = (routed.sort(-1).values == free.sort(-1).values).all(-1)[known]  # [tokens, L]
    print({"token x layer top-k sets equal": same.float().mean().item()})
    assert same.float().mean() >= 0.9

    def gap(replay: bool) -> float:
        def logp(mb, output, non_loss_data=True):
            return {"logp": token_logprobs(actor, output, mb["tokens"], mcore_ctx.pgs.tp)[0]}
        rows = {"tokens": tokens, "lengths": lengths, "routed_experts": routed}
        with RoutingHooks([actor], replay=replay) as hooks:
            got = forward_collect([actor], split_micro_batches(rows, micro_batch_size=8), logp, ("logp",),
                                  tokens.size(1), mcore_ctx.pgs.pp, hooks=hooks)["logp"]
        mask = batch.response_mask
        return (got[mask] - batch.rollout_logprobs[mask]).abs().mean().item()
    replayed, routed_freely = gap(True), gap(False)
    print({"mean |logp - rollout logp|, R3 replay": replayed, "free routing": routed_freely})
    assert replayed <= routed_freely and replayed < 0.02

