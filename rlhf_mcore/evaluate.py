"""Validation only: `python -m rlhf_mcore.evaluate --config CFG --checkpoint DIR [a.b=value ...]`, under torchrun as
training runs (any layout).

`--checkpoint` is any of:
- a training checkpoint (`<output_dir>/global_step_N`): its actor's weights, resharded to this run's layout;
- a megatron dist-checkpoint of a model (`tools/convert_checkpoint.py hf-to-mcore`): `model.load`;
- an HF model directory (config.json + weights, e.g. an export): `model.hf_path`, loaded directly.

It runs the run's validation (`data.val_files`, `data.val_batch_size`, verl's `val_kwargs`: `rollout.val_n`,
`val_temperature`, `val_top_p`, `val_top_k`, `val_do_sample`; metrics `val-core/<source>/<name>/mean@N`, best@N,
worst@N), prints them, and writes into `--out` (default `runs/evaluate/<checkpoint name>`; a previous evaluation
there is moved aside): `eval.json` (the metrics and what was evaluated) and `generations/<step>.jsonl` (every prompt,
response, ground truth and score; verl's `trainer.validation_data_dir`). Nothing is trained or saved.
Exit codes as `rlhf_mcore.train`'s (2: the checkpoint or config cannot be used, one line each).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def checkpoint_overrides(path: str) -> list[str]:
    """The config overrides that load `path`; ValueError (one line) when it is none of the three kinds."""
    if os.path.isfile(os.path.join(path, "checkpoint.json")):  # the actor's weights of a training checkpoint
        return [f"model.load={os.path.join(path, 'actor')}"]
    if os.path.isfile(os.path.join(path, "config.json")):
        return [f"model.hf_path={path}", "model.load="]
    if os.path.isfile(os.path.join(path, "metadata.json")):
        return [f"model.load={path}"]
    what = "does not exist" if not os.path.exists(path) else "holds no checkpoint.json (a training checkpoint), " \
        "config.json (an HF model) or metadata.json (a megatron checkpoint)"
    raise ValueError(f"--checkpoint {path}: {what}. Pass a global_step_N directory of a run, an HF model "
                     "directory, or a converted megatron checkpoint.")


def evaluate_run(cfg) -> None:
    """Build the run (weights as `checkpoint_overrides` says), validate once, write eval.json."""
    from rlhf_mcore.trainer.run import start_run

    run = start_run(cfg)
    try:
        metrics = run.log_validation(run.start_step)
        if run.ctx.is_logging_rank:
            out = os.path.join(cfg.trainer.output_dir, "eval.json")
            with open(out + ".tmp", "w") as f:
                json.dump({"step": run.start_step, "model": cfg.model.hf_path, "load": cfg.model.load,
                           "resume": cfg.trainer.resume, "val_files": cfg.data.val_files, "metrics": metrics}, f,
                          indent=2)
            os.replace(out + ".tmp", out)
            print(f"evaluation: {out} | generations: {cfg.trainer.validation_data_dir}", flush=True)
    finally:
        run.close()


def main(argv=None) -> int:
    from rlhf_mcore import train

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m rlhf_mcore.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, add_help=True)
    parser.add_argument("--checkpoint", required=True, help="global_step_N of a run, an HF dir or a megatron dir")
    parser.add_argument("--out", default="", help="where eval.json and generations/ go")
    args, rest = parser.parse_known_args(argv)
    try:
        loads = checkpoint_overrides(args.checkpoint)
    except ValueError as e:
        print(f"cannot start:\n  - {e}", file=sys.stderr)
        return 2
    out = args.out or os.path.join("runs", "evaluate", os.path.basename(os.path.normpath(args.checkpoint)))
    given = {o.split("=", 1)[0].lstrip("+") for o in rest if "=" in o}
    dumps = [] if "trainer.validation_data_dir" in given else [f"trainer.validation_data_dir={out}/generations"]
    return train.main([*rest, *loads, f"trainer.output_dir={out}", "trainer.resume=restart", *dumps],
                      body=evaluate_run)


if __name__ == "__main__":
    sys.exit(main())
