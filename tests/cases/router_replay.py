"""`router_replay OUT.json [a.b=value ...]` (tests/dist/trainer/test_router_replay.py): one GRPO step with the
routing capture on every rank; rank 0 writes each rank's mismatches and row count, the tokens x layers whose
experts differ from the batch's routed_experts (R2: the old pass's record; R3: the rollout's) in the old pass and
each optimizer step ("replayed"), and the step's metrics, as JSON."""
import json

import pytest
import torch.distributed as dist

from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer.loop import train
from tests.support.paths import ROOT_STR as ROOT
from tests.support.routing_capture import RoutingCapture


def main(out_path: str, *overrides: str) -> None:
    import os

    with pytest.MonkeyPatch.context() as patch:
        capture = RoutingCapture().install(patch)
        cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", list(overrides), world_size=int(os.environ["WORLD_SIZE"]))
        run = train(cfg)
    recorded = capture.recorded()
    mine = {"mismatches": capture.mismatches(), "rows": len(capture.old),
            "replayed": [capture.differ(capture.old, recorded)] + [capture.differ(s, recorded) for s in capture.update]}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() == 0:
        result = {key: [g[key] for g in gathered] for key in mine} | {"metrics": run.history[-1]}
        with open(out_path, "w") as f:
            json.dump(result, f)
    from rlhf_mcore.parallel import destroy_distributed

    destroy_distributed()


def entry(argv: list[str]) -> None:
    main(*argv)
