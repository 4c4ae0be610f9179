"""Every out-of-range value the issue found accepted, and a few more: exit 2, one line naming the key."""
import pytest

from rlhf_mcore.train import main
from tests.support.reliability import TINY

BAD = [  # (override, the key the one error line must name)
    ("actor.optim.adam_beta1=2", "actor.optim.adam_beta1"), ("actor.optim.adam_beta2=1", "actor.optim.adam_beta2"),
    ("actor.optim.adam_eps=-1", "actor.optim.adam_eps"), ("actor.optim.weight_decay=-1", "actor.optim.weight_decay"),
    ("actor.optim.min_lr_ratio=5", "actor.optim.min_lr_ratio"), ("actor.optim.lr=inf", "actor.optim.lr"),
    ("actor.optim.lr=nan", "actor.optim.lr"), ("critic.optim.lr=-inf", "critic.optim.lr"),
    ("actor.optim.lr_warmup_steps=-3", "actor.optim.lr_warmup_steps"),
    ("actor.clip_ratio_low=-1", "actor.clip_ratio_low"), ("actor.clip_ratio_high=-0.1", "actor.clip_ratio_high"),
    ("actor.clip_ratio_c=0.5", "actor.clip_ratio_c"), ("algorithm.gamma=2", "algorithm.gamma"),
    ("algorithm.lam=-1", "algorithm.lam"), ("algorithm.kl_coef=-1", "algorithm.kl_coef"),
    ("algorithm.target_kl=0", "algorithm.target_kl"), ("algorithm.kl_horizon=0", "algorithm.kl_horizon"),
    ("actor.entropy_coeff=-5", "actor.entropy_coeff"), ("actor.kl_loss_coef=-1", "actor.kl_loss_coef"),
    ("actor.rollout_correction_threshold=0", "actor.rollout_correction_threshold"),
    ("rollout.sglang.gpu_memory_utilization=5", "rollout.sglang.gpu_memory_utilization"),
    ("rollout.val_temperature=-1", "rollout.val_temperature"),
    ("rollout.micro_batch_size=-1", "rollout.micro_batch_size"),
    ("reward.overlong_buffer=16", "reward.overlong_buffer"), ("reward.overlong_buffer=-1", "reward.overlong_buffer"),
    ("reward.overlong_penalty_factor=-2", "reward.overlong_penalty_factor"),
    ("reward.max_error_frac=1.5", "reward.max_error_frac"), ("reward.max_error_steps=0", "reward.max_error_steps"),
    ("trainer.save_freq=-7", "trainer.save_freq"), ("trainer.test_freq=-2", "trainer.test_freq"),
    ("trainer.output_dir=", "trainer.output_dir"), ("trainer.seed=-1", "trainer.seed"),
    ("trainer.max_bad_steps=0", "trainer.max_bad_steps"),
    ("parallel.collective_timeout_min=0", "parallel.collective_timeout_min"),
    ("model.max_position_embeddings=40", "model.max_position_embeddings"),
    ("model.num_layers=0", "model.num_layers"), ("model.hidden_size=66", "model.hidden_size"),
    ("model.num_query_groups=3", "model.num_query_groups"), ("model.rope_theta=0", "model.rope_theta"),
    ("model.norm_eps=-1e-6", "model.norm_eps"), ("model.init_std=0", "model.init_std"),
    ("critic.ppo_epochs=0", "critic.ppo_epochs"), ("critic.cliprange_value=0", "critic.cliprange_value"),
]


@pytest.mark.parametrize("override,key", BAD, ids=[b[0] for b in BAD])
def test_out_of_range_value_exits_2_with_one_line_naming_the_key(override, key, capsys):
    assert main(["--config", TINY, "--validate-only", override]) == 2
    err = capsys.readouterr().err
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith(f"  - {key}: "), err
    assert "Traceback" not in err


def test_dynamic_batch_token_budget_must_hold_one_sequence(capsys):
    assert main(["--config", TINY, "--validate-only", "actor.use_dynamic_bsz=true", "actor.max_tokens_per_gpu=40"]) == 2
    assert "  - actor.max_tokens_per_gpu: must hold one sequence of" in capsys.readouterr().err


def test_the_shipped_presets_still_validate(capsys):
    for name in ("tiny_grpo", "tiny_ppo"):
        assert main(["--config", TINY.replace("tiny_grpo", name), "--validate-only"]) == 0, capsys.readouterr().err
