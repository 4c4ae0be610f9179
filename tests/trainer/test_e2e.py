"""PPO and GRPO end to end under torchrun (gloo): finite losses, every trainable parameter changes, and
the whole RL loop (rollout included) gives the same metrics at TP/PP splits of one DP replica."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e_worker.py")
pytestmark = pytest.mark.dist

# Metrics that must agree across layouts of one DP replica (same prompts, same sampling seeds).
COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm",
            "critic/vf_loss", "critic/advantages/mean")
# Metrics that do not depend on how rows fall into micro-batches (the loss functions' metrics are weighted by
# their tokens over the whole update, trainer/metrics.py).
PACKING_INVARIANT = ("critic/score/mean", "response_length/mean", "actor/loss", "actor/grad_norm", "critic/loss",
                     "critic/grad_norm", "critic/advantages/mean", "critic/values/mean", "actor/pg_loss",
                     "actor/entropy", "critic/vf_loss")


def run_worker(tmp_path, nproc: int, config: str, *overrides: str) -> dict:
    out = tmp_path / f"result_{nproc}_{abs(hash(overrides))}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           WORKER, str(out), os.path.join(ROOT, "configs", config),
           f"trainer.output_dir={tmp_path}/run_{nproc}_{abs(hash(overrides))}", "trainer.save_freq=0",
           "trainer.resume=disable", *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def check_trained(result: dict, steps: int) -> None:
    assert result["finite"], result["metrics"]
    assert len(result["metrics"]) == steps
    assert result["num_params"] > 0 and result["unchanged"] == [], result["unchanged"]


def assert_same_metrics(a: dict, b: dict, rtol: float = 1e-4, keys: tuple[str, ...] = COMPARED) -> None:
    for step_a, step_b in zip(a["metrics"], b["metrics"]):
        for key in keys:
            if key in step_a:
                assert step_b[key] == pytest.approx(step_a[key], rel=rtol, abs=1e-6), key


def test_grpo_two_ranks_tp_and_pp_match_one_rank(tmp_path):
    base = run_worker(tmp_path, 1, "tiny_grpo.yaml", "trainer.total_steps=2")
    check_trained(base, 2)
    for split in (("parallel.tp=2",), ("parallel.pp=2",)):
        result = run_worker(tmp_path, 2, "tiny_grpo.yaml", "trainer.total_steps=2", *split)
        check_trained(result, 2)
        assert_same_metrics(base, result)


def test_ppo_four_ranks_tp_pp_dp(tmp_path):
    """TP2 x PP2 (DP1) reproduces the 1-rank PPO run; TP2 x DP2 trains every parameter on every rank."""
    base = run_worker(tmp_path, 1, "tiny_ppo.yaml", "trainer.total_steps=2")
    check_trained(base, 2)
    tp_pp = run_worker(tmp_path, 4, "tiny_ppo.yaml", "trainer.total_steps=2", "parallel.tp=2", "parallel.pp=2")
    check_trained(tp_pp, 2)
    assert_same_metrics(base, tp_pp)
    dp = run_worker(tmp_path, 4, "tiny_ppo.yaml", "trainer.total_steps=2", "parallel.tp=2", "data.train_batch_size=4",
                    "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4", "trainer.test_freq=2",
                    "data.val_batch_size=3")
    check_trained(dp, 2)
    (val,) = dp["validations"]  # DP2, chunks of 3 prompts: every rank reports, the sums meet over DP
    assert val == dp["metrics"][-1] and len(dp["metrics"]) == 2  # step 2's one record holds its validation
    assert val["training/global_step"] == 2 and sorted(k for k in val if k.startswith("val-")) == [
        "val-aux/response_length/clip_ratio", "val-aux/response_length/mean", "val-core/tiny/vowels/acc/mean@1",
        "val-core/tiny/vowels/format/mean@1", "val-core/tiny/vowels/reward/mean@1"]
    assert val["actor/lr"] > 0 and val["critic/lr"] > 0 and -10 < val["critic/vf_explained_var"] <= 1
    assert 0 < val["val-aux/response_length/mean"] <= 16 and 0 <= val["val-core/tiny/vowels/reward/mean@1"] <= 1
    assert dp["metrics"][0]["train/tiny/vowels/reward/mean"] == pytest.approx(dp["metrics"][0]["critic/score/mean"])


def test_ppo_every_role_tp2_pp2(tmp_path):
    """PPO with all four roles in one process group (actor, critic, reference for the KL, a reward model on top
    of the rule reward): TP2 x PP2 reproduces the 1-rank run, reward-model scores included, and every parameter
    of both trainable roles changes."""
    rm = str(tmp_path / "rm")  # a random tiny llama reward model on the byte vocabulary, converted (own process)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                           "-m", "tools.bench.make_reward_model", "--out", rm],  # torchrun: a free port of its own
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    args = ("trainer.total_steps=2", f"reward.model_path={rm}")
    base = run_worker(tmp_path, 1, "tiny_ppo.yaml", *args)
    check_trained(base, 2)
    assert base["trained_roles"] == ["actor", "critic"] and base["roles"] == ["actor", "critic", "ref", "reward"]
    rule_only = run_worker(tmp_path, 1, "tiny_ppo.yaml", "trainer.total_steps=1")
    assert rule_only["metrics"][0]["critic/score/mean"] != pytest.approx(base["metrics"][0]["critic/score/mean"])
    tp_pp = run_worker(tmp_path, 4, "tiny_ppo.yaml", *args, "parallel.tp=2", "parallel.pp=2")
    check_trained(tp_pp, 2)
    assert_same_metrics(base, tp_pp, keys=COMPARED + ("actor/reward_kl",))


def test_sequence_packing_reproduces_padded_runs(tmp_path):
    """data.use_sequence_packing changes no global number: PPO on one rank (actor, critic, reference packed), and
    GRPO at DP2 where packing also deals rows out to balance tokens over the DP ranks: the exact global losses
    and the loss functions' token-weighted metrics (actor/pg_loss, actor/entropy, critic/vf_loss)."""
    packed = ("data.use_sequence_packing=true", "actor.max_tokens_per_gpu=64")
    base = run_worker(tmp_path, 1, "tiny_ppo.yaml", "trainer.total_steps=2")
    result = run_worker(tmp_path, 1, "tiny_ppo.yaml", "trainer.total_steps=2", *packed)
    check_trained(result, 2)
    assert {"actor/loss", "actor/grad_norm", "critic/loss", "critic/values/mean"} <= set(result["metrics"][0])
    assert_same_metrics(base, result, keys=PACKING_INVARIANT)
    dp = ("trainer.total_steps=2", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2")
    base = run_worker(tmp_path, 2, "tiny_grpo.yaml", *dp)
    result = run_worker(tmp_path, 2, "tiny_grpo.yaml", *dp, *packed)
    check_trained(result, 2)
    assert_same_metrics(base, result, keys=PACKING_INVARIANT)
