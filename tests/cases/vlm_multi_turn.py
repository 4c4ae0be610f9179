"""Worker of tests/dist/trainer/test_vlm_multi_turn_layouts.py (torchrun, gloo, 1 or 2 ranks): two GRPO steps of
configs/tiny_vlm_grpo.yaml in multi-turn mode, every assistant turn a calculator call (a scripted parser: random
weights write no `<tool_call>`) whose result writes `<|image_pad|><|video_pad|>7` (image and video ids after the
prompt, which the rollout and the trainer must both read as text). The tiny VLM gets 2048 positions (the tool
schema is 904 byte-level tokens).

    torchrun --nproc_per_node 2 -m tests.worker vlm_multi_turn OUT.json WORK [a.b=value ...]

Rank 0 writes the metrics of each step."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import rlhf_mcore.rollout.modes.build as build_mod
from rlhf_mcore.agent.executor import ToolExecutor, ToolResult
from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer.loop import train
from tests.support.paths import ROOT

STOPS = tuple("abcdefghijklmnopqrstuvwxyz0123456789")  # every letter or digit ends a turn: turns of a few tokens
OVERRIDES = ("trainer.resume=disable", "trainer.export_hf=false", "trainer.total_steps=2",
             "trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=0", "trainer.logger=[jsonl]",
             "rollout.mode=multi_turn", "rollout.multi_turn.tools=[calculator]", "data.max_prompt_length=1200",
             "rollout.max_response_length=32", "data.train_batch_size=4", "rollout.n=4",
             "actor.ppo_mini_batch_size=4", "actor.micro_batch_size_per_gpu=16")


def long_vlm(work: Path) -> Path:
    """data/tiny_vlm with 2048 positions, a copy per rank (no rank waits for another's)."""
    hf = work / f"tiny_vlm_2048_rank{os.environ.get('RANK', '0')}"
    shutil.copytree(ROOT / "data" / "tiny_vlm", hf, dirs_exist_ok=True)
    config = json.loads((hf / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 2048
    (hf / "config.json").write_text(json.dumps(config))
    return hf


def main(out_path: str, work: str, *overrides: str) -> None:
    build_mod.parser_fn = lambda name: (lambda text: [ToolCall("calculator", {"expression": f"{len(text)}*3"})],
                                        STOPS)
    ToolExecutor.run_one = lambda self, *a: ToolResult("<|image_pad|><|video_pad|>7", None, False, 0.0)
    hf = long_vlm(Path(work))
    run_dir = Path(work) / f"run_{Path(out_path).stem}"
    cfg = load_config(str(ROOT / "configs" / "tiny_vlm_grpo.yaml"),
                      [f"model.hf_path={hf}", f"trainer.output_dir={run_dir}", *OVERRIDES, *overrides],
                      world_size=int(os.environ["WORLD_SIZE"]))
    run = train(cfg)
    if run.ctx.rank == 0:
        with open(out_path, "w") as f:
            json.dump([m for m in run.history if "critic/score/mean" in m], f)
    from rlhf_mcore.parallel import destroy_distributed

    destroy_distributed()


def entry(argv: list[str]) -> None:
    main(*argv)
