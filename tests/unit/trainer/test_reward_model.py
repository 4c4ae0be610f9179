"""The reward-model role: an HF *ForSequenceClassification checkpoint, converted, scores sequences in our
megatron model exactly as transformers does (score head at the last valid token)."""
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from rlhf_mcore.convert.mcore import load_full_state_dict
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.weights import hf_to_mcore
from rlhf_mcore.trainer.phases import reward_model_pass
from rlhf_mcore.trainer.roles import Roles
from tests.support.tiny import tiny_model_config


def test_reward_model_scores_match_transformers(mcore_ctx):
    torch.manual_seed(0)
    hf_cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=258, num_labels=1, pad_token_id=257,
                         architectures=["LlamaForSequenceClassification"])
    hf_model = LlamaForSequenceClassification(hf_cfg).eval()
    hf = hf_cfg.to_dict()
    cfg = tiny_model_config()
    reward = build_model("reward", hf, cfg.model, cfg.parallel, mcore_ctx)
    full = hf_to_mcore(hf_model.state_dict(), hf, role="reward")
    load_full_state_dict(reward, full, tp_rank=0, tp_size=1)

    lengths = torch.tensor([9, 5, 12])
    tokens = torch.randint(0, 256, (3, 12))
    tokens[torch.arange(12).unsqueeze(0) >= lengths.unsqueeze(1)] = 257  # right padding
    batch = {"tokens": tokens, "lengths": lengths}
    roles = Roles(actor=None, critic=None, ref=None, reward=reward)
    scores = reward_model_pass(roles, batch, cfg, mcore_ctx)  # [3, 12], the score at the last valid token
    ours = scores[torch.arange(3), lengths - 1]
    with torch.no_grad():
        theirs = hf_model(input_ids=tokens).logits[:, 0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert (scores != 0).sum() == 3  # nothing anywhere else
