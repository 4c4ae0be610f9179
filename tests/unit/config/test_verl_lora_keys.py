"""verl's megatron LoRA block (`actor_rollout_ref.model.lora.*`, Megatron-Bridge's fields, as in verl's
ppo_megatron_trainer.yaml) translates to model.lora_*; megatron's linear names are model.target_modules names;
fields we do not implement name the key and the fix."""
import pytest

from rlhf_mcore.config import load_config
from rlhf_mcore.models.lora import expand_targets

ARR = "actor_rollout_ref.model.lora"
# verl's defaults for the block, rank set (ppo_megatron_trainer.yaml)
VERL_BLOCK = [f"{ARR}.type=lora", f"{ARR}.merge=False", f"{ARR}.rank=16", f"{ARR}.alpha=32", f"{ARR}.dropout=0.0",
              f"{ARR}.target_modules=[linear_qkv,linear_proj,linear_fc1,linear_fc2]", f"{ARR}.exclude_modules=[]",
              f"{ARR}.dropout_position=pre", f"{ARR}.lora_A_init_method=xavier", f"{ARR}.lora_B_init_method=zero",
              f"{ARR}.a2a_experimental=False", f"{ARR}.dtype=null", f"{ARR}.adapter_path=null",
              f"{ARR}.freeze_vision_model=True", f"{ARR}.freeze_vision_projection=True",
              f"{ARR}.freeze_language_model=True"]


def test_verls_megatron_lora_block_sets_our_lora_keys():
    cfg = load_config("configs/tiny_grpo.yaml", [*VERL_BLOCK, "critic.model.lora.rank=4"])
    m = cfg.model
    assert (m.lora_rank, m.lora_alpha, m.lora_dropout, m.lora_adapter_path) == (16, 32.0, 0.0, "")
    assert expand_targets(m.target_modules) == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj")
    assert cfg.critic.lora_rank == 4


@pytest.mark.parametrize("override, message", [
    (f"{ARR}.type=dora", f"{ARR}.type: only lora is supported here (got 'dora')"),
    (f"{ARR}.exclude_modules=[router]", f"{ARR}.exclude_modules: only [] is supported here (got '[router]'): list "
                                        "the projections to adapt in model.target_modules."),
    (f"{ARR}.target_modules=[linear_qvk]", "model.target_modules: unknown module 'linear_qvk' (got ['linear_qvk'])."
                                           " Did you mean 'linear_qkv'?"),
])
def test_what_we_do_not_implement_names_the_key_and_the_fix(override, message):
    with pytest.raises(ValueError) as err:
        load_config("configs/tiny_grpo.yaml", [f"{ARR}.rank=8", override])
    assert message in str(err.value)


def test_megatron_names_stand_for_their_projections():
    assert expand_targets(["linear_qkv"]) == ("q_proj", "k_proj", "v_proj")
    assert expand_targets(["linear_proj", "linear_fc1"]) == ("o_proj", "gate_proj", "up_proj")
    assert expand_targets(["linear_fc2", "down_proj"]) == ("down_proj",)
