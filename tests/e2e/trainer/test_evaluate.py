"""`python -m rlhf_mcore.evaluate`: validation only, from a training checkpoint (one rank, and resharded to TP2), with
verl's val_kwargs; its metrics are the training run's validation at that step, and every sample is dumped."""
import json

import pytest

from tests.launch import cli, torchrun
from tests.support.paths import CONFIGS

VAL = ("rollout.val_n=2", "rollout.val_temperature=1.0", "rollout.val_do_sample=true")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two steps of the tiny preset, both saved, validated at step 2 with VAL (shared by the tests below)."""
    run = tmp_path_factory.mktemp("evaluate") / "run"
    cli("rlhf_mcore.train", "--config", CONFIGS / "tiny_grpo.yaml", "trainer.total_steps=2", "trainer.save_freq=1",
        "trainer.test_freq=2", "trainer.export_hf=false", f"trainer.output_dir={run}", *VAL)
    return run


def test_evaluate_a_checkpoint_reproduces_the_runs_validation(run, tmp_path):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    want = {k: v for k, v in rows[-1].items() if k.startswith(("val-core/", "val-aux/"))}
    assert any(k.endswith("/mean@2") for k in want) and any(k.endswith("/best@2/mean") for k in want)
    layouts = {"tp1": (cli, ()), "tp2": (lambda *a, **kw: torchrun(*a[:1], 2, *a[1:], **kw), ("parallel.tp=2",))}
    for name, (launch, layout) in layouts.items():
        out = tmp_path / f"eval_{name}"
        launch("rlhf_mcore.evaluate", "--config", CONFIGS / "tiny_grpo.yaml", "--checkpoint", run / "global_step_2",
               "--out", out, *VAL, *layout)
        got = json.loads((out / "eval.json").read_text())["metrics"]
        assert got.keys() == want.keys()
        for key, value in want.items():  # one rank: the same numbers; TP2: the same samples, summed in another order
            assert abs(got[key] - value) <= (0 if name == "tp1" else 1e-4), (name, key, got[key], value)
        dumped = [json.loads(line) for line in (out / "generations" / "0.jsonl").read_text().splitlines()]
        assert dumped and {"input", "output", "ground_truth", "reward"} <= dumped[0].keys()
        assert len(dumped) % 2 == 0  # val_n=2 samples per prompt


def test_a_path_that_is_no_checkpoint_is_one_line_and_exit_2(tmp_path):
    out = cli("rlhf_mcore.evaluate", "--config", CONFIGS / "tiny_grpo.yaml", "--checkpoint", tmp_path, check=False)
    assert out.returncode == 2
    assert "holds no checkpoint.json (a training checkpoint), config.json (an HF model)" in out.stderr
    assert "Traceback" not in out.stderr


def test_generate_samples_what_evaluation_decodes(run, tmp_path):
    """`python -m rlhf_mcore.generate` on a run's checkpoint and its validation prompts (greedy): the same responses
    as the evaluation of that checkpoint dumped; prompts from the command line go through the chat template too."""
    config = CONFIGS / "tiny_grpo.yaml"
    checkpoint = run / "global_step_1"
    cli("rlhf_mcore.evaluate", "--config", config, "--checkpoint", checkpoint, "--out", tmp_path / "eval")
    want = [json.loads(line)["output"] for line in (tmp_path / "eval" / "generations" / "0.jsonl").read_text()
            .splitlines()]
    from rlhf_mcore.config.load import load_config

    val_files = load_config(str(config), []).data.val_files
    out = cli("rlhf_mcore.generate", "--config", config, "--checkpoint", checkpoint, "--prompts", val_files,
              "--prompt", "abc", "--out", tmp_path / "gen.jsonl")
    got = [json.loads(line) for line in (tmp_path / "gen.jsonl").read_text().splitlines()]
    assert [g["response"] for g in got[1:]] == want and got[0]["prompt"] == "abc"
    assert "----- response -----" in out.stdout
    bad = cli("rlhf_mcore.generate", "--config", config, "--checkpoint", checkpoint, check=False)
    assert bad.returncode == 2 and "no prompts" in bad.stderr


def test_verls_val_only_validates_once_and_trains_nothing(tmp_path):
    run = tmp_path / "run"
    cli("rlhf_mcore.train", "--config", CONFIGS / "tiny_grpo.yaml", "trainer.val_only=true", "trainer.total_steps=3",
        f"trainer.output_dir={run}")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] and any(k.startswith("val-core/") for k in rows[0])
    assert not list(run.glob("global_step_*"))
