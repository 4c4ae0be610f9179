"""The training CLI's front door: `--validate-only` prints the resolved config or one line per bad field
(exit 2), verl's command lines run, bad expert layouts stop before anything is built."""
import json

import pytest

from tests.launch import cli
from tests.support.paths import ROOT_STR as ROOT
from tests.support.paths import TINY
from tests.support.verl import verl_grpo_command


def run_cli(*args):
    return cli("rlhf_mcore.train", *args, check=False, timeout=120)


def test_cli_validate_only_prints_resolved_config_or_errors():
    ok = run_cli("--config", TINY, "--validate-only", "rollout.n=8")
    assert ok.returncode == 0, ok.stderr
    assert "n: 8" in ok.stdout and "adv_estimator: grpo" in ok.stdout
    bad = run_cli("--config", TINY, "--validate-only", "rollout.n=two", "actor.optim.lrr=1")
    assert bad.returncode == 2
    assert "rollout.n: expected int" in bad.stderr and "actor.optim.lrr: unknown key" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_cli_runs_a_verl_command_line(verl_model_dir):
    runnable = ["model.init=random", "model.tokenizer=bytes", "data.train_batch_size=256",  # --validate-only checks
                f"reward.custom_fn={ROOT}/data/tiny/reward.py:vowel_fraction"]  # the data against the batch too
    done = run_cli("--validate-only", *verl_grpo_command(verl_model_dir), *runnable)
    assert done.returncode == 0, done.stderr
    assert "verl key actor_rollout_ref.model.path -> model.hf_path" in done.stderr
    assert "max_response_length: 1024" in done.stdout


def test_training_cli_stops_at_bad_expert_layouts_before_anything_is_built(tmp_path):
    """`python -m rlhf_mcore.train` (one process, world size 1) on the tiny MoE preset with parallel.ep=3: the
    expert count and the world size are checked with the config, one line each, exit 2, no run directory."""
    out = tmp_path / "never"
    proc = run_cli("--config", "configs/tiny_moe_grpo.yaml", "parallel.ep=3", f"trainer.output_dir={out}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and not out.exists()
    lines = [line.strip() for line in proc.stderr.splitlines() if "parallel.ep" in line]
    assert lines == ["- parallel.ep: must divide the expert count 8 (got 3). Pick a divisor of num_experts, or ep=1.",
                     "- parallel.ep: must divide tp*dp = world / pp = 1 (got ep=3). Launch a multiple of pp*ep "
                     "ranks, or pick a divisor."]


def test_verls_val_kwargs_give_mean_best_and_worst_at_n(tmp_path):
    """val_kwargs.n=4 with sampling: every data source gets mean@4, best@4 and worst@4 (verl's names), ordered as
    they must be; a mean@16 evaluation never quietly becomes mean@1."""
    out = tmp_path / "run"
    cli("rlhf_mcore.train", "--config", TINY, "trainer.total_steps=1", "trainer.export_hf=false",
        "trainer.val_before_train=true", f"trainer.output_dir={out}", "actor_rollout_ref.rollout.val_kwargs.n=4",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"trainer.validation_data_dir={tmp_path / 'val'}", timeout=300)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = next(r for r in rows if any(k.startswith("val-core/") for k in r))
    keys = sorted(k for k in val if k.startswith("val-core/tiny/vowels/reward/"))
    assert keys == ["val-core/tiny/vowels/reward/best@4/mean", "val-core/tiny/vowels/reward/mean@4",
                    "val-core/tiny/vowels/reward/worst@4/mean"]
    worst, mean, best = (val[f"val-core/tiny/vowels/reward/{k}"] for k in ("worst@4/mean", "mean@4", "best@4/mean"))
    assert worst <= mean <= best and worst < best  # 4 sampled responses differ
    dumped = [json.loads(line) for line in (tmp_path / "val" / "0.jsonl").read_text().splitlines()]
    assert len(dumped) == 16 * 4 and sum(r["reward"] for r in dumped) / len(dumped) == pytest.approx(mean, abs=1e-6)
