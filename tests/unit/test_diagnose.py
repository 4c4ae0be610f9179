"""python -m rlhf_mcore.diagnose: machine, packages, optional imports, and the code paths of a config."""
from rlhf_mcore.config import Config
from rlhf_mcore.config.load import load_config
from rlhf_mcore.diagnose import code_paths, main, package_version, try_import


def test_code_paths_follow_the_machine_and_the_config():
    cfg = Config()
    cpu = dict(code_paths(cfg, have_cuda=False, have_te=False, have_triton=False, sglang_status="not installed"))
    assert cpu["attention"].startswith("sdpa: model.attention_backend=auto and Transformer Engine is not")
    assert cpu["log-prob kernel"].endswith("torch chunks: no CUDA") and cpu["distributed"].startswith("gloo")
    gpu = dict(code_paths(cfg, have_cuda=True, have_te=True, have_triton=True, sglang_status="yes"))
    assert gpu["attention"].startswith("te:") and gpu["norm"].startswith("Transformer Engine")
    assert gpu["log-prob kernel"].endswith("Triton: CUDA and triton importable") and gpu["distributed"] == "NCCL"
    forced = load_config(None, ["model.attention_backend=local", "rollout.engine=sglang"], check=False)
    paths = dict(code_paths(forced, True, True, False, "fails: ImportError: x"))
    assert paths["attention"] == "local: set by model.attention_backend"
    assert paths["rollout"] == "sglang: embedded engine per GPU (SGLang import: fails: ImportError: x)"
    assert paths["log-prob kernel"].endswith("triton not importable")


def test_versions_and_imports_without_importing_missing_packages():
    assert package_version("torch") != "not installed"
    assert package_version("surely-not-a-package-xyz") == "not installed"
    assert try_import("json") == "yes" and try_import("surely_not_a_module_xyz") == "not installed"


def test_main_prints_every_section(capsys):
    assert main(["--config", "configs/tiny_grpo.yaml", "rollout.n=4"]) == 0
    out = capsys.readouterr().out
    for section in ("== machine", "== packages", "== optional imports", "== config configs/tiny_grpo.yaml: valid",
                    "== code paths for configs/tiny_grpo.yaml"):
        assert section in out
    assert "megatron-core        0.16.1" in out and "Transformer Engine" in out and "  attention " in out


def test_main_explains_a_config_that_would_not_run(capsys):
    assert main(["--config", "configs/tiny_grpo.yaml", "data.train_files=/nope.parquet"]) == 0
    out = capsys.readouterr().out
    assert "a run would stop here" in out and "data.train_files: file not found" in out and "  rollout " in out


def test_lora_roles_report_what_they_train_and_save(tmp_path):
    """The start-up lines of the LoRA roles, by hand: a 2-layer model, h 64, q 64, kv 32, ffn 128, fp32."""
    from rlhf_mcore.diagnose import lora_lines

    assert lora_lines(load_config("configs/tiny_ppo.yaml", [], check=False)) == []
    cfg = load_config("configs/tiny_ppo.yaml", ["model.num_layers=2", "model.lora_rank=8", "critic.lora_rank=4",
                                                "model.target_modules=[q_proj,v_proj]"], check=False)
    actor, critic = lora_lines(cfg)
    # actor: 2 layers x 8 x ((64 + 64) + (32 + 64)) = 3584 adapter params; the reference shares the actor
    assert actor.startswith("actor lora: rank 8, alpha 16 on q_proj,v_proj: 3.6K trainable params")
    assert "reference = actor without adapters" in actor
    assert critic.startswith("critic lora: rank 4, alpha 16 on q_proj,v_proj: 1.8K trainable params")
    assert "reference" not in critic
