"""rollout.mode=multi_turn with a scripted engine and SmolLM2's real tokenizer: token in, token out (ids the
engine sampled, ids that do not survive decode -> encode, reach the trainer unchanged), the loss mask (1 only
on sampled tokens; tool output and template tokens get zero gradient), limits, and the GSM8K reward on the
last assistant turn only."""
from __future__ import annotations

import pytest
import torch

from rlhf_mcore.chat import render_prompt, tool_delta_ids
from rlhf_mcore.rollout.modes import Rollout
from rlhf_mcore.rollout.modes.multi_turn import turn_seed
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.trainer.phases import decode_responses, make_batch
from tests.support.multi_turn import Row, ScriptedEngine, calculator_executor, smollm2_tokenizer, tool_env

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12340+5"}}</tool_call>'
PARAMS = SamplingParams(n=2, max_new_tokens=120, temperature=1.0, stop_token_ids=(2,), seed=11)


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture()
def executor():
    ex = calculator_executor()
    yield ex
    ex.close()


def char_ids(tok, text: str) -> list[int]:
    """`text` as one token per character: ids the tokenizer itself would never produce for it."""
    return [i for ch in text for i in tok.encode(ch)]


def prompt_rows(tok):
    from rlhf_mcore.agent.tools import load_tools, tool_schemas

    schemas = tool_schemas(load_tools(["calculator"], None).values())
    return [Row(tuple(tok.encode(render_prompt(tok, [{"role": "user", "content": q}], schemas))))
            for q in ("What is 12340+5?", "Add 5 to 12340.")]


def test_sampled_ids_reach_the_trainer_exactly_and_only_they_are_trained(tok, executor):
    a, b = char_ids(tok, "hello, I will call it"), char_ids(tok, "so it is #### 12345")
    assert tok.encode(tok.decode(a)) != a and tok.encode(tok.decode(b)) != b  # decode -> encode changes them
    first = a + tok.encode(CALL)
    engine = ScriptedEngine([lambda row, k: first, lambda row, k: b + [2]], pad_id=tok.pad_id)
    prompts = prompt_rows(tok)
    rollout = Rollout(engine, "multi_turn", tool_env(tok, executor, max_turns=3)).generate(prompts, PARAMS)
    delta = tool_delta_ids(tok, ["12345"])
    assert tok.decode(delta, skip_special_tokens=False) == \
        "<|im_end|>\n<|im_start|>tool\n12345<|im_end|>\n<|im_start|>assistant\n"
    batch = make_batch(rollout, torch.ones(4), torch.tensor([0, 0, 1, 1]), seq_len=rollout.tokens.size(1) + 7)
    for i in range(4):
        prompt = list(prompts[i // 2].prompt_ids)
        want = prompt + first + delta + b + [2]
        assert batch.tokens[i, :len(want)].tolist() == want  # the trainer's input ids: the sampled ids, exactly
        assert rollout.tokens[i, len(want):].eq(tok.pad_id).all()
        mask = [0] * len(prompt) + [1] * len(first) + [0] * len(delta) + [1] * (len(b) + 1)
        assert batch.response_mask[i, :len(want)].tolist() == mask and not batch.response_mask[i, len(want):].any()
        assert batch.token_level_scores[i].nonzero().squeeze().item() == len(want) - 1  # the last policy token
        policy = batch.response_mask[i].bool()
        assert batch.rollout_logp[i][~policy].eq(0).all()  # tool and template tokens: placeholder log-probs
    second_rows, second = engine.calls[1]
    assert second_rows == [list(prompts[i // 2].prompt_ids) + first + delta for i in range(4)]  # exact prefixes
    assert (second.n, second.seed, second.max_new_tokens) == (1, turn_seed(11, 1), 120 - len(first) - len(delta))
    assert "</tool_call>" in second.stop_strings and "</tool_call>" in engine.calls[0][1].stop_strings
    text = decode_responses(rollout, tok.decode)[0]
    assert "12345" in text and "tool\n12345" not in text and text.endswith("#### 12345")  # assistant turns only
    assert rollout.turns.num_turns == [2] * 4 and rollout.turns.tool_calls == [1] * 4
    assert rollout.turns.tool_errors == [0] * 4 and rollout.finish_reasons == ["stop"] * 4


def test_tool_and_template_tokens_get_zero_gradient(tok, executor):
    """The trainer's loss pieces (GRPO advantages, the PPO clip loss, k3 KL, entropy bonus, token-mean) on a
    multi-turn batch: d loss / d logits is exactly 0 at every position predicting a prompt, tool-output or
    template token, and non-zero at every position predicting a sampled token."""
    from rlhf_mcore.algorithms.advantages import ADVANTAGES, AdvantageInputs
    from rlhf_mcore.algorithms.aggregate import aggregate_loss
    from rlhf_mcore.algorithms.kl import kl_penalty
    from rlhf_mcore.algorithms.losses import POLICY_LOSSES, PolicyLossInputs, compute_entropy_bonus

    a = char_ids(tok, "let me compute")
    script = [lambda row, k: a + tok.encode(CALL), lambda row, k: char_ids(tok, "#### 12345"[k:]) + [2]]
    rollout = Rollout(ScriptedEngine(script, tok.pad_id), "multi_turn", tool_env(tok, executor)).generate(
        prompt_rows(tok), PARAMS)
    batch = make_batch(rollout, torch.tensor([1.0, 0.0, 0.5, 0.2]), torch.tensor([0, 0, 1, 1]),
                       seq_len=rollout.tokens.size(1))
    mask, vocab = batch.response_mask, 64
    tokens = batch.tokens % vocab  # a small vocabulary: which ids they are does not matter here
    logits = torch.randn(*tokens.shape, vocab, generator=torch.Generator().manual_seed(0)).requires_grad_()
    logsm = torch.log_softmax(logits, -1)  # logits[:, t] predicts token t + 1
    logp = torch.nn.functional.pad(logsm[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0], (1, 0))
    entropy = torch.nn.functional.pad(-(logsm.exp() * logsm).sum(-1)[:, :-1], (1, 0))
    adv, _ = ADVANTAGES.get("grpo")(AdvantageInputs(token_level_rewards=batch.token_level_scores, response_mask=mask,
                                                    group_index=batch.group_index))
    per_token, _ = POLICY_LOSSES.get("vanilla")(PolicyLossInputs(
        logp=logp, old_logp=logp.detach() - 0.1, advantages=adv, response_mask=mask, clip_ratio_low=0.2,
        clip_ratio_high=0.2, clip_ratio_c=3.0))
    per_token = per_token + 0.1 * kl_penalty(logp, logp.detach() + 0.3, "k3")
    per_token = per_token + compute_entropy_bonus(entropy, mask, 0.01)[0]
    loss, _, _ = aggregate_loss(per_token, mask, "token-mean")
    loss.backward()
    grad = logits.grad.abs().sum(-1)  # [B, S]
    # which tokens the policy sampled, from the script alone (not from the batch's mask): prompt, turn 1,
    # the tool turn's ids, turn 2
    sampled = torch.zeros_like(mask, dtype=torch.bool)
    delta = len(tool_delta_ids(tok, ["12345"]))
    for i in range(4):
        start, first = int(batch.prompt_lengths[i]), len(a + tok.encode(CALL))
        second = len(char_ids(tok, "#### 12345"[i:])) + 1  # the script's k is the row
        sampled[i, start:start + first] = True
        sampled[i, start + first + delta:start + first + delta + second] = True
    assert torch.equal(mask.bool(), sampled)
    predicts = torch.nn.functional.pad(sampled[:, 1:], (0, 1))  # position t predicts a sampled token t + 1
    assert (grad[~predicts] == 0).all()
    assert (grad[predicts] > 0).all()
    assert (~predicts & (batch.tokens != tok.pad_id)).any(1).all()  # every row has masked non-pad tokens


def test_budget_turns_and_tool_call_limits(tok, executor):
    """The total response budget ends a sample cleanly ("length", on a sampled token, tool output dropped);
    max_turns ends it; calls past max_tool_calls get an error result; a parse error is the model's result."""
    call = tok.encode(CALL)
    two_calls = tok.encode(CALL + CALL.replace("12340+5", "1+1"))
    bad = tok.encode('<tool_call>{"name": "calculator", "arguments": </tool_call>')
    env = tool_env(tok, executor, max_turns=2, max_tool_calls=1)
    script = [lambda row, k: [two_calls, bad, call, call][k], lambda row, k: [5, 6, 2]]
    rows = prompt_rows(tok)
    budget = len(call) + 3  # row 3: its tool turn does not fit
    out = Rollout(ScriptedEngine(script, tok.pad_id), "multi_turn", env).generate(
        rows, SamplingParams(n=2, max_new_tokens=len(two_calls) + 120, stop_token_ids=(2,), seed=1))
    assert out.turns.tool_calls[:2] == [2, 1] and out.turns.tool_errors[:2] == [1, 1]  # too many; parse
    texts = [tok.decode(out.tokens[0].tolist()), tok.decode(out.tokens[1].tolist())]
    assert "at most 1" in texts[0] and "could not be parsed" in texts[1]
    limited = Rollout(ScriptedEngine(script, tok.pad_id), "multi_turn", env).generate(
        rows, SamplingParams(n=2, max_new_tokens=budget, stop_token_ids=(2,), seed=1))
    assert limited.finish_reasons[2:] == ["length", "length"] and limited.turns.num_turns[2:] == [1, 1]
    assert limited.response_lengths[2:].tolist() == [len(call)] * 2  # ends on the last sampled token
    env1 = tool_env(tok, executor, max_turns=1)
    single = Rollout(ScriptedEngine(script, tok.pad_id), "multi_turn", env1).generate(rows, PARAMS)
    assert single.turns.num_turns == [1] * 4 and single.finish_reasons == ["length"] * 4
    assert single.loss_mask.sum(-1).tolist() == [len(two_calls), len(bad), len(call), len(call)]


def test_without_tool_calls_multi_turn_is_single_turn(tok, executor):
    """No tool call: the one generate call single_turn makes, and the same batch (tokens, mask, log-probs)."""
    script = [lambda row, k: char_ids(tok, "no tools")[:5 + k] + [2]]
    rows = prompt_rows(tok)
    single = Rollout(ScriptedEngine(script, tok.pad_id), "single_turn").generate(rows, PARAMS)
    engine = ScriptedEngine(script, tok.pad_id)
    multi = Rollout(engine, "multi_turn", tool_env(tok, executor)).generate(rows, PARAMS)
    assert len(engine.calls) == 1 and engine.calls[0][1].seed == PARAMS.seed
    for name in ("tokens", "loss_mask", "rollout_logprobs", "prompt_lengths", "response_lengths"):
        assert torch.equal(getattr(single, name), getattr(multi, name)), name
    assert torch.equal(single.loss_mask, single.response_mask)


@pytest.mark.parametrize("turns,want", [
    (["Let me check.", "The answer is 71."], 0.0),  # the tool printed "#### 72": never scored
    (["#### 72", "Hmm, or 71?"], 0.0),  # an answer in an earlier turn is not the final answer
    (["Let me check.", "#### 72"], 1.0),
])
def test_gsm8k_multi_turn_scores_the_last_assistant_turn(turns, want):
    from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score
    from rlhf_mcore.rollout.types import RolloutBatch, TurnInfo
    from rlhf_mcore.trainer.scoring import reward_extra_info

    tool_output = "12 * 6 = 72\n#### 72"
    # one trajectory: turn 1, the tool's output, turn 2, as token ids of a toy character tokenizer
    text = [turns[0], f"\ntool: {tool_output}\n", turns[1]]
    ids = [ord(c) for part in text for c in part]
    a, b = len(text[0]), len(text[0]) + len(text[1])
    rollout = RolloutBatch(tokens=torch.tensor([ids]), prompt_lengths=torch.tensor([0]),
                           response_lengths=torch.tensor([len(ids)]), rollout_logprobs=torch.zeros(1, len(ids)),
                           finish_reasons=["stop"], turns=TurnInfo([[(0, a), (b, len(ids))]], [1], [0], [0]))
    decode = lambda x: "".join(map(chr, x))  # noqa: E731
    assert "12 * 6" not in decode_responses(rollout, decode)[0]  # the reward's text: assistant turns only
    info = reward_extra_info(rollout, [Row((), {"tools_kwargs": {}, "interaction_kwargs": {"x": 1}})], decode)[0]
    assert info["assistant_turns"] == turns and info["tool_calls"] == 1 and info["interaction_kwargs"] == {"x": 1}
    # even given the whole trajectory text, the reward reads only the last assistant turn
    assert compute_gsm8k_score("openai/gsm8k", decode(ids), "72", info)["score"] == want


def test_tools_kwargs_reach_the_tool_as_its_context(tok):
    """verl's extra_info.tools_kwargs[name].create_kwargs: the row's kwargs are the tool's context."""
    from rlhf_mcore.agent.executor import ToolExecutor
    from rlhf_mcore.agent.schema import Tool

    seen = []
    echo = Tool(name="echo", description="echo", parameters={"type": "object", "properties": {}},
                fn=lambda args, ctx: seen.append(ctx) or "ok", sandboxed=False)
    call = tok.encode('<tool_call>{"name": "echo", "arguments": {}}</tool_call>')
    with ToolExecutor({"echo": echo}, timeout_s=5, max_output_chars=100, memory_mb=256, workers=1) as ex:
        rows = [Row((1, 2), {"tools_kwargs": {"echo": {"create_kwargs": {"ground_truth": "7"}}}}), Row((3,))]
        Rollout(ScriptedEngine([lambda row, k: call, lambda row, k: [2]]), "multi_turn", tool_env(tok, ex)).generate(
            rows, SamplingParams(n=1, max_new_tokens=60, stop_token_ids=(2,)))
    assert sorted(map(str, seen)) == sorted(["{'ground_truth': '7'}", "{}"])



@pytest.mark.parametrize("stops", [("</tool_call>",), ("\n",), ("</tool_call>", "####")])
def test_stop_string_prefilter_finds_every_stop_the_full_check_finds(tok, stops):
    """`stopping.may_end` (one cached decode per token id) skips only rows that cannot stop: on SmolLM2's real
    tokenizer, at every prefix of texts holding the stop strings, the hits equal the unfiltered check's."""
    from rlhf_mcore.rollout.stopping import ends_with_stop_string, stop_string_hits, tail_window

    texts = [CALL + " and then", 'x</tool_call>\n#### 12', "a\nb\n\nc ####5</tool_call>", "no stop here at all"]
    tails = [ids[max(0, k - tail_window(stops)):k] for ids in map(tok.encode, texts) for k in range(1, len(ids) + 1)]
    want = [ends_with_stop_string(t, stops, tok.decode) for t in tails]
    assert stop_string_hits(tails, stops, tok.decode) == want and sum(want) >= 2


def test_turn_end_sampled_trains_the_policys_own_end_of_turn_after_a_call(tok, executor):
    """rollout.multi_turn.turn_end=sampled (verl's agent loop): a turn runs past </tool_call> to the end-of-turn
    token, which the policy samples (loss mask 1); the tool turn then starts after it, so the row holds one
    <|im_end|> there, the policy's, not the template's. No </tool_call> stop string is sent to the engine."""
    import dataclasses

    from rlhf_mcore.rollout.modes.build import end_of_turn_text

    end = tok.encode("<|im_end|>")
    assert end == [2] and end_of_turn_text(tok) == "<|im_end|>"
    first, second = char_ids(tok, "let me add") + tok.encode(CALL) + end, char_ids(tok, "#### 12345") + end
    engine = ScriptedEngine([lambda row, k: first, lambda row, k: second], pad_id=tok.pad_id)
    env = dataclasses.replace(tool_env(tok, executor, max_turns=3, turn_end="sampled"), stop_strings=(),
                              sampled_end=end_of_turn_text(tok))
    prompts = prompt_rows(tok)
    rollout = Rollout(engine, "multi_turn", env).generate(prompts, PARAMS)
    delta = tool_delta_ids(tok, ["12345"], "<|im_end|>")
    text = tok.decode(delta, skip_special_tokens=False)
    assert text == "\n<|im_start|>tool\n12345<|im_end|>\n<|im_start|>assistant\n"
    for i in range(4):
        p = len(prompts[i // 2].prompt_ids)
        want = first + delta + second
        assert rollout.tokens[i, p:p + len(want)].tolist() == want
        mask = [1] * len(first) + [0] * len(delta) + [1] * len(second)
        assert rollout.loss_mask[i, p:p + len(want)].int().tolist() == mask  # the sampled <|im_end|> is trained
    assert all("</tool_call>" not in params.stop_strings for _, params in engine.calls)
    assert rollout.turns.num_turns == [2] * 4 and rollout.turns.tool_calls == [1] * 4
    assert rollout.finish_reasons == ["stop"] * 4


def test_turn_end_is_checked(capsys):
    from rlhf_mcore.config.load import ConfigError, load_config
    from tests.support.paths import CONFIGS

    with pytest.raises(ConfigError) as info:
        load_config(str(CONFIGS / "tiny_tool_grpo.yaml"), ["rollout.multi_turn.turn_end=model"])
    assert info.value.errors == ["rollout.multi_turn.turn_end: must be one of template, sampled (got 'model'). "
                                 "'template' stops a turn at the end of its tool call; 'sampled' lets the policy "
                                 "write the end of its turn."]
