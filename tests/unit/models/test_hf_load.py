"""`model.hf_path` alone loads the HF weights (models/hf_load.py): bitwise what the converter then a megatron
load gives, in the trainer's roles and at TP2 / PP2 (torchrun, gloo); a run never starts from random weights
without `model.init=random`."""
import os
from types import SimpleNamespace

import pytest
import torch

from rlhf_mcore.models.hf_load import weight_source
from tests.support.paths import ROOT
from tests.support.tiny_hf import save_tiny

TINY_PPO = os.path.join(ROOT, "configs", "tiny_ppo.yaml")
BLANK = ["model.num_layers=null", "model.hidden_size=null", "model.ffn_hidden_size=null",
         "model.num_attention_heads=null", "model.num_query_groups=null", "model.vocab_size=null"]


def model_cfg(**fields):
    return SimpleNamespace(**{"load": "", "init": "auto", "hf_path": "", **fields})


def test_weight_source_never_starts_random_silently(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError) as info:
        weight_source(model_cfg(hf_path=str(tmp_path)))
    assert str(info.value).startswith("model.init: auto found no weights in model.hf_path (got ")
    assert "\n" not in str(info.value) and "model.init=random" in str(info.value)
    assert weight_source(model_cfg(hf_path=str(tmp_path), init="random")) == ("random", "model.init=random")
    assert weight_source(model_cfg(hf_path=str(tmp_path), load="ckpt")) == ("load", "ckpt")  # load wins
    assert weight_source(model_cfg())[0] == "random"  # an inline (tiny) architecture
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))  # a readable file (its header is checked)
    assert weight_source(model_cfg(hf_path=str(tmp_path))) == ("hf", str(tmp_path))


def _roles(overrides, ctx):
    from rlhf_mcore.config.load import load_config
    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.trainer.roles import build_roles

    cfg = load_config(TINY_PPO, BLANK + overrides)
    return build_roles(cfg, load_hf_config(cfg.model), ctx)


def _first_logprobs(model, tokens, ctx):
    from rlhf_mcore.models.logprobs import token_logprobs

    pos = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        return token_logprobs(model, model(tokens, pos, None), tokens, ctx.pgs.tp)[0]


def test_hf_path_only_gives_the_converted_checkpoints_logprobs(hf_load_work, mcore_ctx, caplog):
    hf_dir, mcore = hf_load_work / "hf" / "qwen2", hf_load_work / "mcore" / "qwen2"
    with caplog.at_level("INFO"):
        direct = _roles([f"model.hf_path={hf_dir}"], mcore_ctx)
    assert f"actor: weights from HF {hf_dir}/model.safetensors" in caplog.text
    converted = _roles([f"model.hf_path={hf_dir}", f"model.load={mcore}",
                        f"reward.model_path={hf_load_work / 'mcore' / 'qwen2_rm'}"], mcore_ctx)
    tokens = torch.randint(0, 250, (2, 11), generator=torch.Generator().manual_seed(0))
    for name in ("actor", "ref"):
        a, b = (getattr(r, name) for r in (direct, converted))
        a, b = (m.module if hasattr(m, "module") else m for m in (a, b))
        assert torch.equal(_first_logprobs(a, tokens, mcore_ctx), _first_logprobs(b, tokens, mcore_ctx)), name
    random = _roles([f"model.hf_path={hf_dir}", "model.init=random"], mcore_ctx)
    assert not torch.equal(_first_logprobs(random.actor.module, tokens, mcore_ctx),
                           _first_logprobs(direct.actor.module, tokens, mcore_ctx))
    critic_a, critic_b = dict(direct.critic.module.named_parameters()), dict(converted.critic.module.named_parameters())
    assert all(torch.equal(p, critic_b[k]) for k, p in critic_a.items()), "critic: HF trunk, value head as built"
    with_rm = _roles([f"model.hf_path={hf_dir}", f"reward.model_path={hf_load_work / 'hf' / 'qwen2_rm'}"], mcore_ctx)
    rm_b = dict(converted.reward.named_parameters())
    assert all(torch.equal(p, rm_b[k]) for k, p in with_rm.reward.named_parameters()), "reward model from HF"


def test_missing_weights_stop_before_any_model_is_built(tmp_path, mcore_ctx, monkeypatch):
    import rlhf_mcore.trainer.roles as roles

    save_tiny(tmp_path, "qwen2")
    (tmp_path / "model.safetensors").unlink()
    monkeypatch.setattr(roles, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(ValueError, match=r"^model.init: auto found no weights in model.hf_path"):
        _roles([f"model.hf_path={tmp_path}"], mcore_ctx)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_safetensors_file_is_named_before_any_model_is_built(tmp_path, mcore_ctx, monkeypatch, damage):
    import rlhf_mcore.trainer.roles as roles

    save_tiny(tmp_path, "qwen2")
    shard = tmp_path / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2] if damage == "truncated" else os.urandom(4096))
    monkeypatch.setattr(roles, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(ValueError) as info:
        _roles([f"model.hf_path={tmp_path}"], mcore_ctx)
    message = str(info.value)
    assert message.startswith(f"{shard}: not a readable weight file (") and "\n" not in message, message
    assert message.endswith("Download or convert it again."), message


def test_hf_path_only_moe_gives_the_converted_checkpoints_logprobs(hf_load_moe_work, mcore_ctx, caplog):
    """Qwen3-MoE and Mixtral: `model.hf_path` alone gives the first log-probs of the converted checkpoint."""
    for case in ("qwen3_moe", "mixtral"):
        hf_dir = hf_load_moe_work / "hf" / case
        with caplog.at_level("INFO"):
            direct = _roles([f"model.hf_path={hf_dir}"], mcore_ctx)
        assert f"actor: weights from HF {hf_dir}/model.safetensors" in caplog.text
        converted = _roles([f"model.hf_path={hf_dir}", f"model.load={hf_load_moe_work / 'mcore' / case}"], mcore_ctx)
        tokens = torch.randint(0, 250, (2, 11), generator=torch.Generator().manual_seed(0))
        a, b = (r.actor.module for r in (direct, converted))
        assert torch.equal(_first_logprobs(a, tokens, mcore_ctx), _first_logprobs(b, tokens, mcore_ctx)), case
