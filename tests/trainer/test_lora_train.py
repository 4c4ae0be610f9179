"""LoRA runs of the trainer (issue 25): PPO with a LoRA actor and a LoRA critic (rank 8 / rank 4, the
critic's fresh value head trainable) trains on CPU, its checkpoints hold adapters only and record the
settings, and a run resumed from its step-2 checkpoint repeats the straight run's step 3 bitwise."""
import json

import pytest
from torch.distributed.checkpoint import FileSystemReader

from tests.checkpoint.test_trainer_resume import TIMING_KEYS, train

pytestmark = pytest.mark.slow
LORA = ("model.lora_rank=8", "model.lora_alpha=16", "critic.lora_rank=4", "actor.optim.lr=1e-2",
        "critic.optim.lr=1e-2")


def test_ppo_lora_actor_and_critic_train_and_resume_bitwise(tmp_path):
    straight = train(tmp_path / "a", *LORA, "trainer.save_freq=2")
    steps = [m for m in straight if "actor/pg_loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        assert all(m[k] == m[k] and abs(m[k]) < 1e6 for k in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm",
                                                              "critic/grad_norm"))
        assert m["actor/grad_norm"] > 0 and m["critic/grad_norm"] > 0
    assert steps[2]["critic/vf_loss"] != steps[0]["critic/vf_loss"]
    meta = json.loads((tmp_path / "a" / "global_step_2" / "checkpoint.json").read_text())
    assert meta["roles"]["actor"]["lora"]["rank"] == 8 and meta["roles"]["critic"]["lora"]["rank"] == 4
    log = (tmp_path / "a.log").read_text()
    assert "actor lora: rank 8" in log and "critic lora: rank 4" in log  # the start-up lines name the LoRA roles
    for role, extra in (("actor", set()), ("critic", {"output_layer.weight"})):  # adapters (+ the value head) only
        keys = FileSystemReader(str(tmp_path / "a" / "global_step_2" / role)).read_metadata().state_dict_metadata
        tensors = {k.split("optimizer.state.exp_avg_sq.")[-1].split("optimizer.state.exp_avg.")[-1] for k in keys}
        assert {k for k in tensors if ".lora_" not in k} == extra, role
        assert any(".lora_A." in k for k in tensors) and any(".lora_B." in k for k in tensors), role
    resumed = train(tmp_path / "b", *LORA, f"trainer.resume={tmp_path / 'a' / 'global_step_2'}")
    want = [m for m in straight if m.get("step") == 3][-1]
    got = [m for m in resumed if m.get("step") == 3][-1]
    assert [m.get("step") for m in resumed if "actor/pg_loss" in m] == [3]
    compared = [k for k in want if not k.startswith(TIMING_KEYS)]
    assert len(compared) > 20 and {k: got.get(k) for k in compared} == {k: want[k] for k in compared}
