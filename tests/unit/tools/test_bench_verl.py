"""tools/bench/bench_verl_grpo.py, verl_hooks.py and eval_gsm8k_hf.py without verl (issue 41's CPU dry run): the
commands match our benchmark shape and preset, verl's console lines parse, the MFU is our formula by hand, the
deadline ends verl's loop, verl's reward is ours, and the evaluator scores by the strict rule."""
import doctest
import importlib
import json
import sys
import types

import pytest
import yaml

from rlhf_mcore.import_hooks import after_import
from rlhf_mcore.models.flops import forward_flops_per_token
from tools.bench import bench_verl_grpo as bench
from tools.bench import eval_gsm8k_hf, verl_hooks
from tools.bench.bench_trl_grpo import word_tokenizer


def overrides(cmd: list[str]) -> dict:
    return dict(arg.lstrip("+").split("=", 1) for arg in cmd[3:])


def test_hooks_doctests():
    assert doctest.testmod(verl_hooks).failed == 0
    assert doctest.testmod(eval_gsm8k_hf).failed == 0


def test_step_job_is_bench_grpo_steps_shape():
    keys = overrides(bench.verl_command("step", "/m", "/d", "/w", 4, tokenizer="/t"))
    shape = bench.STEP_SHAPE
    assert keys["data.train_batch_size"] == str(shape["prompts"]) == "64"
    assert keys["actor_rollout_ref.rollout.n"] == "8"
    assert keys["data.max_prompt_length"] == "128" and keys["data.max_response_length"] == "256"
    # one optimizer step a step, as bench_grpo_step's default: the mini-batch is every prompt
    assert keys["actor_rollout_ref.actor.ppo_mini_batch_size"] == keys["data.train_batch_size"]
    assert keys["actor_rollout_ref.actor.use_kl_loss"] == "False"
    assert keys["reward.custom_reward_function.name"] == "random_score"
    assert keys["actor_rollout_ref.model.tokenizer_path"] == "/t"
    assert keys["trainer.total_training_steps"] == "4"
    # verl's default token budget: 4x it thrashed the H200's memory with the 152k-vocab logits (69 s a step)
    assert keys["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "16384"
    again = overrides(bench.verl_command("step", "/m", "/d", "/w", 4, max_tokens=24576))
    assert again["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "24576"
    # SGLang as our engine sets it: decode graphs cover the 512-row batch
    assert keys["actor_rollout_ref.rollout.engine_kwargs.sglang.cuda_graph_max_bs_decode"] == "512"
    assert keys["actor_rollout_ref.rollout.max_num_seqs"] == "512"  # one wave, as ours (verl's default: 256)
    # no flash-attn wheel: sdpa, and no remove-padding (it would mix packed sequences under sdpa)
    assert keys["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert keys["actor_rollout_ref.model.use_remove_padding"] == "False"


def test_gsm8k_job_is_our_preset_in_verls_keys():
    preset = yaml.safe_load(open("configs/gsm8k_grpo_smollm2.yaml"))
    keys = overrides(bench.verl_command("gsm8k", "/m", "/d", "/w", 100000))
    assert int(keys["data.train_batch_size"]) == preset["data"]["train_batch_size"]
    assert int(keys["data.max_prompt_length"]) == preset["data"]["max_prompt_length"]
    assert int(keys["data.max_response_length"]) == preset["rollout"]["max_response_length"]
    assert int(keys["actor_rollout_ref.rollout.n"]) == preset["rollout"]["n"]
    assert float(keys["actor_rollout_ref.rollout.temperature"]) == preset["rollout"]["temperature"]
    actor = preset["actor"]
    assert float(keys["actor_rollout_ref.actor.optim.lr"]) == actor["optim"]["lr"]
    assert int(keys["actor_rollout_ref.actor.ppo_mini_batch_size"]) == actor["ppo_mini_batch_size"]
    assert int(keys["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]) == actor["max_tokens_per_gpu"]
    assert float(keys["actor_rollout_ref.actor.kl_loss_coef"]) == actor["kl_loss_coef"]
    assert actor["kl_loss_type"] == "k3" and keys["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert keys["actor_rollout_ref.actor.loss_agg_mode"] == actor["loss_agg_mode"]
    assert verl_hooks.PRESET_FORMAT_SCORE == preset["reward"]["format_score"]
    assert verl_hooks.PRESET_POST_ANSWER_PENALTY == preset["reward"]["post_answer_penalty"]
    assert keys["reward.custom_reward_function.name"] == "preset_score"
    assert keys["ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"] == \
        "tools.bench.verl_hooks.setup_worker"
    assert "hf_model" in keys["actor_rollout_ref.actor.checkpoint.save_contents"]
    assert keys["actor_rollout_ref.rollout.engine_kwargs.sglang.cuda_graph_max_bs_decode"] == str(
        preset["data"]["train_batch_size"] * preset["rollout"]["n"])


def test_preset_score_is_what_our_trainer_scores():
    from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score
    from rlhf_mcore.rewards.penalties import apply_penalties, post_answer_penalties

    texts = ["so 72\n#### 72", "#### 71", "no answer", "#### 72\nmore text", "#### 7,2\n"]
    want = apply_penalties([compute_gsm8k_score("openai/gsm8k", t, "72", format_score=0.1)["score"] for t in texts],
                           post_answer_penalties(texts, "gsm8k", 0.1))
    assert [verl_hooks.preset_score("openai/gsm8k", t, "72") for t in texts] == pytest.approx(want)
    assert want == pytest.approx([1.0, 0.1, 0.0, 0.9, 1.0])


def test_console_lines_parse_numpy_reprs_and_ray_prefixes():
    lines = ["(TaskRunnerV1 pid=7) step:3 - timing_s/gen:np.float64(1.25) - perf/mfu/actor:0.31 - "
             "response_length/mean:255.5 - critic/score/mean:-0.1 - actor/lr:1e-05 - x:nan",
             "unrelated: 5 - y:2", "step:4 - timing_s/step:2.5"]
    steps = bench.parse_console(lines)
    assert [s["step"] for s in steps] == [3, 4]
    assert steps[0]["timing_s/gen"] == 1.25 and steps[0]["critic/score/mean"] == -0.1
    assert steps[0]["actor/lr"] == 1e-05 and steps[0]["response_length/mean"] == 255.5
    assert steps[1] == {"step": 4, "timing_s/step": 2.5}


def test_step_summary_by_hand():
    hf = {"hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 16, "num_attention_heads": 2,
          "num_key_value_heads": 1, "vocab_size": 32}
    shape = dict(prompts=2, n=2, prompt_len=4, new_tokens=4)
    warm = {"timing_s/step": 9.0, "timing_s/gen": 9.0}
    timed = [{"timing_s/step": s, "timing_s/gen": 1.0, "timing_s/old_log_prob": 0.5, "timing_s/update_actor": 1.5,
              "response_length/mean": 4.0, "prompt_length/mean": 4.0, "actor/perf/max_memory_allocated_gb": s}
             for s in (3.0, 4.0, 5.0)]
    out = bench.summarize_step([warm, *timed], hf, shape)
    assert out["step_s"] == 4.0 and out["timed_steps"] == 3 and out["peak_mem_gib"] == 5.0  # verl 0.9.1's key
    assert out["phases_s"]["gen"] == 1.0 and out["phases_s"]["sync_weights"] == 0.0
    assert out["tokens_per_s"] == 4 * 8 / 4.0 and out["rollout_tokens_per_s"] == 4 * 4 / 1.0
    flops = forward_flops_per_token(hf, 8 / 2) * 4 * 8  # one forward of 4 rows of 8 tokens
    assert out["logprob_update_mfu"] == pytest.approx((1 + 3) * flops / 2.0 / 790e12)
    assert out["update_mfu"] == pytest.approx(3 * flops / 1.5 / 790e12)


def test_word_tokenizer_has_a_one_token_newline_and_bare_prompts(tmp_path):
    from transformers import AutoTokenizer

    word_tokenizer(300).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)  # what verl loads from model.tokenizer_path
    assert tok.encode("\n", add_special_tokens=False) == [2]
    text = tok.apply_chat_template([{"role": "user", "content": "t10 t299 t42"}], add_generation_prompt=True,
                                   tokenize=False)
    assert tok.encode(text, add_special_tokens=False) == [10, 299, 42]
    # the vocabulary of the real shape: words that begin like a special token stay one token each
    big = word_tokenizer(151936)
    words = " ".join(f"t{i}" for i in (10, 17, 100, 1999, 151935, 3))
    assert big(words)["input_ids"] == [10, 17, 100, 1999, 151935, 3]


def test_dry_run_prepares_the_tiny_step_job(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench.tempfile, "mkdtemp", lambda prefix="": str(tmp_path))
    bench.dry_run()
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "qwen2"
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    assert len(rows) == 2 * bench.TINY_SHAPE["prompts"]
    assert len(rows[0]["prompt"][0]["content"].split(" ")) == bench.TINY_SHAPE["prompt_len"]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["step_s"] == 2.75 and summary["rollout_tokens_per_s"] == 8 * 8 / 1.5


def test_deadline_counts_from_the_first_step_and_ends_verls_loop():
    module = types.SimpleNamespace(PPOTrainer=type("PPOTrainer", (), {
        "_compute_metrics": lambda self, batch, metrics, timing_raw, global_steps, epoch: "metrics"}))
    now = [1000.0]
    verl_hooks.wrap_trainer(module, minutes=1.0, clock=lambda: now[0])
    trainer = module.PPOTrainer()
    trainer.global_steps, trainer.total_training_steps = 1, 100000
    assert trainer._compute_metrics(None, {}, {"step": 10.0}, 1, 0) == "metrics"  # began at 990
    now[0], trainer.global_steps = 1049.0, 5
    trainer._compute_metrics(None, {}, {"step": 10.0}, 5, 0)
    assert trainer.total_training_steps == 100000  # 59 s of training
    now[0], trainer.global_steps = 1051.0, 6
    trainer._compute_metrics(None, {}, {"step": 10.0}, 6, 0)
    assert trainer.total_training_steps == 7  # verl's loop: step 7 is the last, and saves


def test_an_end_by_time_ends_verls_loop_before_its_minutes():
    """BENCH_VERL_END_BY: a start-up that leaves less than `minutes` before the device call's end cuts training
    short (ours then trains as long: train_minutes)."""
    module = types.SimpleNamespace(PPOTrainer=type("PPOTrainer", (), {
        "_compute_metrics": lambda self, batch, metrics, timing_raw, global_steps, epoch: "metrics"}))
    now = [1000.0]
    verl_hooks.wrap_trainer(module, minutes=5.0, clock=lambda: now[0], end_by=1100.0)
    trainer = module.PPOTrainer()
    trainer.global_steps, trainer.total_training_steps = 1, 100000
    trainer._compute_metrics(None, {}, {"step": 10.0}, 1, 0)
    assert trainer.total_training_steps == 100000
    now[0], trainer.global_steps = 1101.0, 9
    trainer._compute_metrics(None, {}, {"step": 10.0}, 9, 0)
    assert trainer.total_training_steps == 10  # 111 s of training, not 300
    assert bench.train_minutes([{"timing_s/step": 10.0}] * 10, 5.0) == pytest.approx(100 / 60)


def test_after_import_patches_a_module_on_first_import(tmp_path, monkeypatch):
    (tmp_path / "late_module_41.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    after_import("late_module_41", lambda m: seen.append(m.VALUE))
    try:
        module = importlib.import_module("late_module_41")
        assert seen == [1] and module.VALUE == 1
        after_import("late_module_41", lambda m: seen.append(2))  # already imported: at once
        assert seen == [1, 2]
    finally:
        sys.modules.pop("late_module_41", None)
        sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "name", None) != "late_module_41"]


def test_evaluator_scores_by_the_strict_rule():
    responses = ["so 72\n#### 72", "the answer is 72", "#### 1,000", "#### 5\n#### 72"]
    out = eval_gsm8k_hf.score(responses, ["72", "72", "1000", "72"])
    assert out["n"] == 4 and out["format"] == 0.75
    assert out["acc"] == out["acc_ours_rule"] == 0.75 and out["disagreements"] == 0


def test_evaluator_loads_verls_rule_without_its_package_init(tmp_path, monkeypatch):
    """On the box verl's __init__ fails without Ray (a lease's evaluator-only calls): its score must load anyway."""
    score_dir = tmp_path / "verl" / "utils" / "reward_score"
    score_dir.mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text("import ray_is_not_installed_41\n")
    (score_dir / "gsm8k.py").write_text("def compute_score(solution_str, ground_truth):\n"
                                        "    return 1.0 if ground_truth in solution_str else 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "verl", raising=False)
    rule = eval_gsm8k_hf.verl_strict()
    assert rule is not None and rule("#### 72", "72") == 1.0 and rule("#### 7", "72") == 0.0
    out = eval_gsm8k_hf.score(["#### 72", "the answer is 72"], ["72", "72"])  # the stand-in is looser than ours
    assert out["rule"] == "verl" and out["acc"] == 1.0 and out["acc_ours_rule"] == 0.5 and out["disagreements"] == 1
    assert "verl" not in sys.modules  # its __init__ never ran


def test_real_job_comparison_by_hand(tmp_path):
    """compare_jobs on gpu_verl.sh's files: steps, training seconds, samples a second, start-up, the evaluators'
    accuracy (two files, as when a lease evaluates verl's export alone), and the ratios."""
    verl = [{"step": 1, "timing_s/step": 30.0, "critic/score/mean": 0.0, "perf/total_num_tokens": 1000.0},
            {"step": 2, "timing_s/step": 10.0, "critic/score/mean": 0.5, "perf/total_num_tokens": 1000.0}]
    ours = [{"step": 0, "val-core/x": 0.1}] + [{"step": k, "timing_s/step": 3.0 if k <= 4 else 1.0,
                                                "critic/score/mean": 0.1 * k} for k in range(1, 11)]
    (tmp_path / "verl_gsm8k_steps.json").write_text(json.dumps(verl))
    (tmp_path / "verl_gsm8k.json").write_text(json.dumps({"startup_s": 280.0}))
    (tmp_path / "ours_gsm8k_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ours))
    (tmp_path / "eval_gsm8k.json").write_text(json.dumps({"models": {
        "start": {"acc": 0.003}, "ours": {"acc": 0.025, "se": 0.0043, "format": 0.99}}}))
    (tmp_path / "eval_gsm8k_verl.json").write_text(json.dumps({"models": {"verl": {"acc": 0.02, "se": 0.004,
                                                                                   "format": 0.9}}}))
    (tmp_path / "eval_gsm8k_samples.jsonl").write_text("not JSON: the evaluator's samples are not read\n")
    out = bench.compare_jobs(str(tmp_path), rows_per_step=8)
    v, o = out["systems"]["verl"], out["systems"]["ours"]
    assert (v["steps"], v["train_s"], v["step_s"], v["startup_s"]) == (2, 40.0, 10.0, 280.0)
    assert v["samples_per_s"] == 16 / 40 and v["tokens_per_s"] == 2000 / 40 and v["acc"] == 0.02
    assert (o["steps"], o["train_s"], o["samples_per_s"], o["tokens_per_s"]) == (10, 18.0, 80 / 18, None)
    assert (o["step_s"], o["step_s_first5"], o["acc"]) == (1.0, 3.0, 0.025)  # steps 2-10 and 2-6, after warm-up
    assert o["score_first5"] == pytest.approx(0.3) and o["score_last5"] == pytest.approx(0.8)
    assert out["ratio_samples_per_s"] == (80 / 18) / 0.4 and out["start_model"] == {"acc": 0.003}
    assert (out["ratio_step_s"], out["ratio_step_s_first5"]) == (10.0, 10.0 / 3.0)
    assert json.loads((tmp_path / "vs_verl_gsm8k.json").read_text()) == json.loads(json.dumps(out))


def test_a_silent_hang_is_killed_at_the_timeout_and_ready_is_timed(tmp_path):
    import os
    import time

    start = time.monotonic()
    rc, ready = bench.run_verl(["bash", "-c", "echo 'x ready to fit'; sleep 60"], tmp_path / "v.log", 1.0,
                               dict(os.environ))
    assert rc == -9 and ready is not None and ready < 1.0 and time.monotonic() - start < 10
    assert (tmp_path / "v.log").read_text() == "x ready to fit\n"


@pytest.mark.parametrize("job", ["step", "gsm8k"])
def test_overrides_compose_with_verls_own_config(job):
    """Where verl and Hydra are importable (a dev machine with verl 0.9.1 on the path; not CI), every override
    composes against verl's `ppo_trainer` config: no unknown key, and the values land where the job means them."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("hydra")
    spec = importlib.util.find_spec("verl")
    if spec is None:
        pytest.skip("verl is not importable here")
    from hydra import compose, initialize_config_dir

    cmd = bench.verl_command(job, "/m", "/d", "/w", 4, tokenizer="/t" if job == "step" else "")
    config_dir = Path(spec.origin).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[o for o in cmd[3:] if not o.startswith("hydra.")])
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    assert rollout.max_num_seqs == rollout.engine_kwargs.sglang.cuda_graph_max_bs_decode == 512
    assert actor.ppo_max_token_len_per_gpu == (bench.STEP_MAX_TOKENS if job == "step" else bench.GSM8K_MAX_TOKENS)


def _verls_row_loop(logits, labels):
    """verl 0.9.1's `logprobs_from_logits_v2`, as its source reads: one row of `logits` at a time."""
    import torch
    import torch.nn.functional as F

    if logits.dtype in (torch.float32, torch.float64):
        return torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - torch.stack(
            [torch.logsumexp(row, dim=-1) for row in logits])
    return torch.stack([F.log_softmax(row, dim=-1).gather(-1, lab.unsqueeze(-1)).squeeze(-1)
                        for row, lab in zip(logits, labels)])


@pytest.mark.parametrize("dtype,shape", [("float32", (7, 50)), ("bfloat16", (7, 50)), ("float32", (3, 5, 50))])
def test_batched_logprobs_are_verls_row_loop(dtype, shape):
    """The stand-in gives verl's fallback's values and gradients, across chunk edges (3 rows a chunk over 7 or 15
    rows), per token (verl's engine passes (tokens, vocab)) and per sequence ((batch, seq, vocab))."""
    import torch

    torch.manual_seed(0)
    logits = (3 * torch.randn(*shape)).to(getattr(torch, dtype)).requires_grad_()
    labels = torch.randint(0, shape[-1], shape[:-1])
    ours = verl_hooks.batched_logprobs(logits, labels, chunk_rows=3)
    ref = _verls_row_loop(logits, labels)
    assert ours.shape == labels.shape and ours.dtype == ref.dtype
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)  # the same kernels on the same rows: bitwise
    (g_ours,), (g_ref,) = (torch.autograd.grad(x.float().square().sum(), logits) for x in (ours, ref))
    torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=0)
    assert verl_hooks.batched_logprobs(logits[:0], labels[:0]).shape == labels[:0].shape


@pytest.mark.parametrize("choice", ["batched", "loop", "typo"])
def test_install_logprobs_patches_verls_fallback_unless_loop(monkeypatch, choice):
    import types

    module = types.ModuleType("verl.utils.torch_functional")
    module.logprobs_from_logits_v2 = verls = object()
    monkeypatch.setitem(sys.modules, "verl.utils.torch_functional", module)
    monkeypatch.setenv(verl_hooks.LOGPROBS_ENV, choice)
    if choice == "typo":
        with pytest.raises(ValueError, match="BENCH_VERL_LOGPROBS='typo'"):
            verl_hooks.install_logprobs()
        return
    verl_hooks.install_logprobs()
    assert module.logprobs_from_logits_v2 is (verl_hooks.batched_logprobs if choice == "batched" else verls)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verls_own_logprobs_give_the_same_values_once_batched(monkeypatch, dtype):
    """Where verl 0.9.1 imports (a dev machine; not CI): its `logprobs_from_logits`, called as its FSDP engine calls
    it (one row per token), gives the same values and gradients before and after `install_logprobs`."""
    import torch

    try:
        import verl.utils.torch_functional as tf
    except ImportError as e:
        pytest.skip(f"verl is not importable here: {e}")
    if tf.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE:
        pytest.skip("flash-attn is installed: verl never reaches its fallback")
    monkeypatch.setattr(tf, "logprobs_from_logits_v2", tf.logprobs_from_logits_v2)  # restored after the test
    monkeypatch.setenv(verl_hooks.LOGPROBS_ENV, "batched")
    torch.manual_seed(0)
    logits = (3 * torch.randn(300, 1000)).to(getattr(torch, dtype)).requires_grad_()
    labels = torch.randint(0, 1000, (300,))
    before = tf.logprobs_from_logits(logits, labels)
    verl_hooks.install_logprobs()
    assert tf.logprobs_from_logits_v2 is verl_hooks.batched_logprobs
    after = tf.logprobs_from_logits(logits, labels)
    torch.testing.assert_close(after, before, rtol=0, atol=0 if dtype == "bfloat16" else 1e-6)
    (g_after,), (g_before,) = (torch.autograd.grad(x.float().sum(), logits) for x in (after, before))
    torch.testing.assert_close(g_after, g_before, rtol=1e-5, atol=1e-6)
