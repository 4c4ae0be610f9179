"""Scoring a rollout: rewards by data_source on the decoded responses, format and overlong penalties,
accuracy and error counts."""
import dataclasses

import pytest
import torch

from rlhf_mcore.data.schema import PromptRow
from rlhf_mcore.rollout.types import RolloutBatch
from rlhf_mcore.tokenizer_bytes import ByteTokenizer
from rlhf_mcore.trainer.scoring import Scorer
from tests.support.tiny import tiny_model_config


def rollout_of(prompt: str, responses: list[str]) -> RolloutBatch:
    tok = ByteTokenizer()
    p = tok.encode(prompt)
    rows = [p + tok.encode(r) for r in responses]
    width = max(map(len, rows))
    tokens = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])
    return RolloutBatch(tokens=tokens, prompt_lengths=torch.tensor([len(p)] * len(rows)),
                        response_lengths=torch.tensor([len(r) for r in responses]),
                        rollout_logprobs=torch.zeros(tokens.shape), finish_reasons=["stop"] * len(rows))


def test_rewards_penalties_and_accuracy(mcore_ctx):
    cfg = tiny_model_config()
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_response_length=12),
                              reward=dataclasses.replace(cfg.reward, num_workers=1, format_penalty=0.5,
                                                         overlong_buffer=4, overlong_penalty_factor=1.0))
    prompt = PromptRow(index=0, data_source="openai/gsm8k", messages=({"role": "user", "content": "2+2"},),
                       ability="math", ground_truth="4", extra_info={})
    responses = ["#### 4", "so 4", "#### 5", "#### 4 ok yes"]  # right; no format; wrong; right but long
    scores, metrics = Scorer(cfg, ByteTokenizer(), mcore_ctx)(rollout_of("Q: 2+2?", responses), [prompt], 4)
    # overlong: 12-token cap, 4-token buffer: length 13 -> past the cap -> -1.0; others are short.
    assert scores.tolist() == [1.0, -0.5, 0.0, 0.0]
    assert metrics["critic/acc/mean"] == 0.5 and metrics["reward/errors"] == 0
    assert metrics["critic/format/mean"] == 0.75  # 3 of 4 hold '#### N'
    assert metrics["train/openai/gsm8k/acc/mean"] == 0.5 and metrics["train/openai/gsm8k/format/mean"] == 0.75
    assert metrics["train/openai/gsm8k/reward/mean"] == 0.125  # mean of the shaped scores
    assert metrics["response_length/clip_ratio"] == 0.25  # "#### 4 ok yes" is 13 bytes >= the 12-token cap


def test_format_score_and_post_answer_penalty(mcore_ctx):
    cfg = tiny_model_config()
    cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, num_workers=1, format_score=0.1,
                                                              post_answer_penalty=0.2))
    prompts = [PromptRow(index=i, data_source=src, messages=({"role": "user", "content": "q"},), ability="math",
                         ground_truth="4", extra_info={}) for i, src in enumerate(("openai/gsm8k", "gsm8k"))]
    # right; right then repeated; wrong (format_score); none | right; wrong then more text; none; right, blank after
    responses = ["#### 4", "#### 4\n#### 4", "#### 5", "4", "x\n#### 4", "#### 5\nso 5", "five", "#### 4\n\n"]
    scores, metrics = Scorer(cfg, ByteTokenizer(), mcore_ctx)(rollout_of("Q", responses), prompts, 4)
    assert scores.tolist() == pytest.approx([1.0, 0.8, 0.1, 0.0, 1.0, -0.1, 0.0, 1.0])
    assert metrics["train/gsm8k/acc/mean"] == 0.5 and metrics["train/openai/gsm8k/acc/mean"] == 0.5
    assert metrics["train/gsm8k/format/mean"] == 0.75 and metrics["critic/format/mean"] == 0.75
    assert metrics["train/openai/gsm8k/reward/mean"] == pytest.approx(1.9 / 4)


def test_accuracy_and_format_only_when_the_reward_gives_them(mcore_ctx, tmp_path):
    """A custom reward returning a bare float says nothing of accuracy or format: the step shows neither
    (they would be guesses: score > 0, and the GSM8K answer check on text the reward never asked for)."""
    fn = tmp_path / "reward.py"
    fn.write_text("def length(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return float(len(solution_str))\n\n"
                  "def graded(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return {'score': 1.0, 'acc': 1.0}\n")
    prompt = PromptRow(index=0, data_source="custom", messages=({"role": "user", "content": "q"},), ability="x",
                       ground_truth="", extra_info={})
    cfg = tiny_model_config()
    for name, shown in (("length", set()), ("graded", {"critic/acc/mean"})):
        cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, num_workers=1,
                                                                  custom_fn=f"{fn}:{name}"))
        scores, metrics = Scorer(cfg, ByteTokenizer(), mcore_ctx)(rollout_of("Q", ["ab", "#### 4"]), [prompt], 2)
        assert {k for k in metrics if "/acc/" in k or "/format/" in k} == \
            shown | {k.replace("critic/", "train/custom/") for k in shown}
        assert "train/custom/reward/mean" in metrics
