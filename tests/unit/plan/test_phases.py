"""The memory plan's per-phase terms: the KV cache equals what the native decoder allocates, the batch follows the
config's micro-batching, and offload and SGLang change the rollout's terms."""
import torch

from rlhf_mcore.config.load import load_config
from rlhf_mcore.plan.dynamic import Batch
from rlhf_mcore.plan.params import Shape
from rlhf_mcore.plan.phases import phase_terms, rank_peak
from rlhf_mcore.plan.rollout import kv_cache_bytes
from rlhf_mcore.plan.static import Layout
from rlhf_mcore.rollout.decode_state import DecodeState
from tests.support.paths import CONFIGS
from tests.support.shapes import HF_SHAPES

SMOL = Shape.of({**HF_SHAPES["smollm2"], "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True})


def test_the_kv_cache_is_the_decoders_allocation():
    rows, length, stage_layers = 6, 40, SMOL.layers // 2
    state = DecodeState.allocate(stage_layers, rows, SMOL.groups, length, SMOL.head_dim, 8, torch.bfloat16, "cpu")
    allocated = (state.k.numel() + state.v.numel()) * state.k.element_size()
    assert kv_cache_bytes(SMOL, rows, length, tp=1, pp=2, dtype="bf16") == allocated


def test_the_batch_follows_the_configs_micro_batching():
    """Packed: balanced bins of whole rows (a 16-prompt mini-batch of 64 rows at DP2 is one 32,768-token bin, under
    the 65,536 budget; the forward pass packs all 256 rows under its own budget); padded: micro-batch rows."""
    packed = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), ["actor.log_prob_max_tokens_per_gpu=131072"],
                         check=False)
    assert Batch.of(packed, dp=2) == Batch(rows=64 * 8 // 2, length=512, update_tokens=64 * 512,
                                           forward_tokens=256 * 512, prompt=256, critic_tokens=64 * 512)
    padded = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), [
        "data.use_sequence_packing=false", "actor.use_dynamic_bsz=false", "rollout.micro_batch_size=100"],
        check=False)
    assert Batch.of(padded, dp=1) == Batch(rows=100, length=512, update_tokens=32 * 512, forward_tokens=32 * 512,
                                           prompt=256, critic_tokens=32 * 512)  # the critic takes the actor's keys


def test_offload_keeps_the_main_weights_and_sglang_changes_the_rollout():
    cfg = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), [], check=False)
    one = Layout(1, 1, 1, 1)
    terms = phase_terms(cfg, SMOL, one)
    training = terms["update"]["grads+optimizer"]
    assert terms["rollout"]["grads+optimizer"] == training > 0
    assert terms["update"]["activations"] > terms["log_prob"]["activations"] > 0
    assert "values" not in terms and "critic_update" not in terms  # GRPO: no critic
    offload = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), ["trainer.offload_during_rollout=true"],
                          check=False)
    params = training // 16  # fp32 grads 4 B + Adam 12 B a parameter; the fp32 main weights (4 B) stay
    assert phase_terms(offload, SMOL, one)["rollout"]["grads+optimizer"] == 4 * params
    sglang = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), ["rollout.engine=sglang"], check=False)
    rollout = phase_terms(sglang, SMOL, one, gpu_bytes=100 * 2**30)["rollout"]
    assert rollout["sglang"] == 50 * 2**30 and "kv_cache" not in rollout
    phase, total, stage = rank_peak(cfg, SMOL, one)
    assert stage == 0 and total == max(sum(t.values()) for t in terms.values()) and phase in terms


def test_the_plan_line_of_validate_only_and_diagnose(tmp_path):
    """`--validate-only` ends with the plan as a YAML comment, `diagnose` prints it; a model it cannot read is
    said in the line."""
    import json

    from rlhf_mcore.plan.phases import plan_line

    (tmp_path / "config.json").write_text(json.dumps({**HF_SHAPES["smollm2"], "architectures": ["LlamaForCausalLM"],
                                                      "tie_word_embeddings": True}))
    cfg = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), [f"model.hf_path={tmp_path}"], check=False)
    # update: 64 rows x 512 = 32,768 tokens (one packed bin); 30 layers x (9,216 x 2 B + 8 + 9 x 4) a token;
    # rollout_cache: the static decoder's KV cache of 256 rows, kept (2 x 30 x 256 x 3 x 512 x 64 x 2 B)
    assert plan_line(cfg, world_size=2) == (
        "memory plan: 23.66 GiB per rank at TP1 PP1 EP1 DP2, peak in the update phase (weights 513.1 MiB + "
        "grads+optimizer 2.00 GiB + rollout_cache 2.81 GiB + activations 16.92 GiB + head 72.1 MiB + logprob 1.35 GiB)"
        "; every layout: python -m rlhf_mcore.plan --config CFG --gpus N --gpu-memory GiB")
    missing = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), [f"model.hf_path={tmp_path}/none"], check=False)
    assert plan_line(missing).startswith("memory plan: not made (model.hf_path: no config.json in ")


def test_the_plan_frees_the_decoders_cache_when_keeping_it_leaves_under_8_percent_free(tmp_path, capsys):
    """The smollm2 preset at DP2 peaks in the update at 23.66 GiB, 2.81 GiB of it the kept decoder cache: on a
    24 GiB device (99%) the cache is freed, on a 26 GiB one (91%) or with the cache already freed it stays as
    configured; a plan that cannot be made changes nothing. The plan command plans what the engine will do."""
    import json

    from rlhf_mcore.plan.phases import cache_release_reason

    (tmp_path / "config.json").write_text(json.dumps({**HF_SHAPES["smollm2"], "architectures": ["LlamaForCausalLM"],
                                                      "tie_word_embeddings": True}))
    cfg = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), [f"model.hf_path={tmp_path}"], check=False)
    gib = 2**30
    assert cache_release_reason(cfg, 24 * gib, world_size=2) == (
        "the memory plan's update phase needs 23.66 GiB of the device's 24.00 GiB (99%) with the decoder's cache "
        "kept (2.81 GiB)")
    assert cache_release_reason(cfg, 25 * gib, world_size=2)  # 94.6%: under 8% free
    assert cache_release_reason(cfg, 26 * gib, world_size=2) == ""
    freed = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), [f"model.hf_path={tmp_path}",
                                                                     "rollout.native.keep_graphs=false"], check=False)
    assert cache_release_reason(freed, 24 * gib, world_size=2) == ""  # no cache term: nothing to free
    missing = load_config(str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), [f"model.hf_path={tmp_path}/none"], check=False)
    assert cache_release_reason(missing, 1 * gib) == ""
    from rlhf_mcore.plan.__main__ import main

    assert main(["--config", str(CONFIGS / "gsm8k_grpo_smollm2.yaml"), f"model.hf_path={tmp_path}", "--gpus", "2",
                 "--gpu-memory", "24"]) == 0
    out = capsys.readouterr().out
    assert "keep_graphs: the memory plan's update phase needs 23.66 GiB" in out
    best = next(line.split() for line in out.splitlines() if line.startswith("  TP1 PP1 EP1 DP2 "))
    assert best[4:] == ["20.84", "GiB", "update", "fits"]  # 23.66 GiB less the 2.81 GiB cache, as the engine runs


def test_the_native_engine_frees_its_cache_when_the_setup_says_why(caplog, monkeypatch):
    """NativeRolloutEngine.build: keep_graphs unless the run's setup carries the plan's reason (logged)."""
    import logging
    from types import SimpleNamespace

    from rlhf_mcore.config.rollout_schema import NativeRolloutConfig
    from rlhf_mcore.rollout.native import NativeRolloutEngine

    made = []
    monkeypatch.setattr(NativeRolloutEngine, "__init__", lambda self, *a, **k: made.append(k["keep_graphs"]))
    setup = SimpleNamespace(model=None, ctx=None, pad_id=0, decode=None, micro_batch_size=0, record_routing=False,
                            release_cache="")
    NativeRolloutEngine.build(NativeRolloutConfig(), setup)
    setup.release_cache = "the memory plan's update phase needs 98%"
    with caplog.at_level(logging.WARNING):
        NativeRolloutEngine.build(NativeRolloutConfig(), setup)
    assert made == [True, False] and "needs 98%; the decoder's cache and graphs are freed" in caplog.text


def test_lora_adapters_and_a_reward_model_are_roles_of_the_plan(tmp_path):
    """LoRA: the base is frozen (weights only) and the adapters train (the count of models.lora_budget, split over
    TP x PP); a reward model's weights come from its own config.json."""
    import json

    from rlhf_mcore.models.lora import LoraSettings
    from rlhf_mcore.models.lora_budget import lora_param_count
    from rlhf_mcore.models.weights import model_dims
    from rlhf_mcore.plan.params import rank_params
    from rlhf_mcore.plan.static import roles_of, stage_bytes

    hf = {**HF_SHAPES["smollm2"], "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    rm = tmp_path / "rm"  # a converted reward model: its HF config under hf/
    (rm / "hf").mkdir(parents=True)
    (rm / "hf" / "config.json").write_text(json.dumps({**hf, "architectures": ["LlamaForSequenceClassification"],
                                                "num_hidden_layers": 4, "num_labels": 1}))
    cfg = load_config(str(CONFIGS / "gsm8k_grpo_lora_smollm2.yaml"), [f"model.hf_path={tmp_path}",
                                                                        f"reward.model_path={rm}"], check=False)
    roles = {r.name: r for r in roles_of(cfg)}
    assert sorted(roles) == ["actor", "adapters", "reward"]  # the reference is the actor without its adapters
    settings = LoraSettings.from_model_cfg(cfg.model)
    adapters = lora_param_count(model_dims(hf, "config.json"), settings.rank, settings.target_modules)
    terms = stage_bytes(SMOL, Layout(2, 1, 1, 1), 0, list(roles.values()), "bf16", False)
    assert terms["actor"] == {"weights": 2 * rank_params(SMOL, 2, 1, 1, 0, True), "grads": 0, "optimizer": 0}
    assert terms["adapters"] == {"weights": 2 * adapters // 2, "grads": 4 * adapters // 2,
                                 "optimizer": 12 * adapters // 2}
    assert terms["reward"]["weights"] == 2 * rank_params(Shape.of({**hf, "num_hidden_layers": 4}), 2, 1, 1, 0, False)
    assert terms["reward"]["grads"] == terms["reward"]["optimizer"] == 0
