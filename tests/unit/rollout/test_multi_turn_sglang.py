"""rollout.mode=multi_turn on the SGLang engine (a stand-in server on CPU: SGLang needs a GPU): later turns send
the server each sample's exact token prefix (prompt + sampled ids + the tool turn's ids), one row per sample,
and the server's ids and log-probs land in the batch as they came, loss mask 1 only on them."""
import torch

from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.chat import tool_delta_ids
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout.modes import Rollout
from rlhf_mcore.rollout.sglang_engine import SGLangRolloutEngine
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.tokenizer_bytes import ByteTokenizer
from tests.support.multi_turn import Row, calculator_executor, tool_env
from tests.support.tiny import tiny_model_config
from tests.unit.rollout.test_sglang_engine import StandIn, setup_for


def test_multi_turn_on_the_sglang_engine_sends_exact_prefixes(mcore_ctx):
    cfg = tiny_model_config(vocab_size=258)
    hf = load_hf_config(cfg.model)
    actor = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    tok = ByteTokenizer()
    server = StandIn()  # answers [last + 1, last + 2] with log-probs (-0.5, -0.25)
    engine = SGLangRolloutEngine(setup_for(actor, hf, mcore_ctx, decode=tok.decode, pad_id=tok.pad_id), 1 << 20,
                                 server)
    executor = calculator_executor()
    try:
        env = tool_env(tok, executor, parse=lambda text: [ToolCall("calculator", {"expression": "6*7"})],
                       max_turns=3)
        prompts = [Row((10, 20, 30)), Row((40,))]
        batch = Rollout(engine, "multi_turn", env).generate(prompts, SamplingParams(n=2, max_new_tokens=200, seed=3))
    finally:
        executor.close()
    delta = tool_delta_ids(tok, ["42"])
    after = delta[-1]  # each later turn continues after the tool turn's last id
    first = {(10, 20, 30): [31, 32], (40,): [41, 42]}
    rows = [list(p.prompt_ids) for p in prompts for _ in range(2)]
    want = [r + first[tuple(r)] + delta + [after + 1, after + 2] + delta + [after + 1, after + 2] for r in rows]
    assert server.prompts[0] == rows  # turn 1: n samples per prompt, as single_turn
    assert server.prompts[1] == [r + first[tuple(r)] + delta for r in rows]  # the exact prefixes
    assert server.prompts[2] == [w[:-2] for w in want] and len(server.prompts) == 3
    for i, w in enumerate(want):
        p = len(rows[i])
        assert batch.tokens[i, :len(w)].tolist() == w
        mask = [0] * p + [1, 1] + [0] * len(delta) + [1, 1] + [0] * len(delta) + [1, 1]
        assert batch.loss_mask[i, :len(w)].int().tolist() == mask
        assert batch.rollout_logprobs[i, :len(w)][batch.loss_mask[i, :len(w)]].tolist() == [-0.5, -0.25] * 3
    assert batch.turns.num_turns == [3] * 4 and batch.turns.tool_calls == [2] * 4
    assert torch.equal(batch.response_lengths, torch.tensor([len(w) - len(r) for w, r in zip(want, rows)]))
