"""Run under torchrun by tests/dist/trainer/test_dynamic_sampling_dist.py: a tiny DAPO run; every rank writes
what it generated (per round: its prompts' tokens and per-sample metric values) and what it trained (per
step: tokens, scores, group ids) to <out>.<rank>.json."""
import json
import os

from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer import phases
from rlhf_mcore.trainer.loop import train


def main(out_path: str, config: str, *overrides: str) -> None:
    cfg = load_config(config, list(overrides), world_size=int(os.environ["WORLD_SIZE"]))
    events = []
    score, update = phases.score, phases.update_role

    def recording_score(*args):
        batch, metrics, values = score(*args)
        events.append({"round": {"tokens": batch.tokens.tolist(),
                                 "values": values[cfg.algorithm.filter_groups.metric].tolist()}})
        return batch, metrics, values

    def recording_update(name, state, batch, *args, **kwargs):
        events.append({"trained": {"tokens": batch["tokens"].tolist(), "group_index": batch["group_index"].tolist(),
                                   "scores": batch["token_level_scores"].sum(-1).tolist()}})
        return update(name, state, batch, *args, **kwargs)

    phases.score, phases.update_role = recording_score, recording_update
    run = train(cfg)
    history = [m for m in run.history if "filter_groups/num_gen_batches" in m]
    with open(f"{out_path}.{run.ctx.rank}.json", "w") as f:
        json.dump({"events": events, "history": history, "dp_rank": run.ctx.dp_rank}, f)
    from rlhf_mcore.parallel import destroy_distributed

    destroy_distributed()


def entry(argv: list[str]) -> None:
    main(*argv)
