"""The training CLI's front door: `--validate-only` prints the resolved config or one line per bad field
(exit 2), verl's command lines run, bad expert layouts stop before anything is built."""
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
                     "- parallel.ep: tp*pp*ep = 3 must divide the world size 1 (got ep=3). Launch a multiple of "
                     "tp*pp*ep ranks."]
