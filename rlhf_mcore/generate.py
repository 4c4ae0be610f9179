"""Sample from a model: `python -m rlhf_mcore.generate --checkpoint DIR --prompt "..." [--prompt ...] [a.b=value ...]`,
or `--prompts FILE.parquet` (verl's schema: its `prompt` messages, and a vision LM's `images`), under torchrun as
training runs (any layout). A vision LM's --prompt takes its `<image>` files from `--image PATH` (repeatable, in order).

`--checkpoint` is what `rlhf_mcore.evaluate` takes: a run's `global_step_N` (its actor), an HF model directory, or a
megatron checkpoint; `--config` adds a run's config (its model, layout and rollout settings). The actor decodes with
the run's rollout engine and the sampling of `rollout.val_*` (verl's val_kwargs; greedy unless
`rollout.val_do_sample=true`), `rollout.val_n` samples per prompt, up to `rollout.max_response_length` tokens. Each
prompt goes through the model's chat template. Prints every sample; `--out FILE.jsonl` writes them too (prompt,
sample index, response, finish reason).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def read_prompts(texts: list[str], images: list[str], parquet: str) -> list[tuple[str, object]]:
    """(where, prompt row: `data.schema.PromptRow`) of each prompt: one user message per --prompt, each taking the next
    --image files for its `<image>` placeholders, then the parquet's rows (their `prompt` messages and `images`)."""
    from rlhf_mcore.data.schema import PromptRow, check_row

    rows, left = [], list(images)
    for i, text in enumerate(texts):
        wanted = text.count("<image>")
        if wanted > len(left):
            raise ValueError(f"--prompt {i}: {wanted} <image> placeholder(s) but {len(left)} --image file(s) left. "
                             "Pass one --image per placeholder, in order.")
        rows.append((f"--prompt {i}", PromptRow(i, "generate", ({"role": "user", "content": text},), "", None, {},
                                                images=tuple(left[:wanted]))))
        left = left[wanted:]
    if left:
        raise ValueError(f"--image: {len(left)} file(s) without an <image> placeholder in any --prompt. Put one "
                         "<image> in a prompt for each.")
    if parquet:
        from rlhf_mcore.data.io import read_parquet_rows

        rows += [(f"{parquet}: row {i}", check_row(row, f"{parquet}: row {i}", i))
                 for i, row in enumerate(read_parquet_rows(parquet))]
    return rows


def prompt_inputs(cfg, tokenizer, prompts: list[tuple[str, object]], parquet: str) -> tuple[list[list[int]], dict]:
    """(prompt ids, the engine's image arguments) of `read_prompts`' rows: a vision LM's image tokens expanded and its
    pixels made (`data.vision_prompt`, as the trainer's; relative image paths: from the working directory, then the
    parquet's), nothing more for a text model, whose rows must have no images (one error naming the row)."""
    from pathlib import Path

    from rlhf_mcore.data.dataset import tokenize_row
    from rlhf_mcore.trainer.inputs import vision_processor

    processor = vision_processor(cfg)
    base = Path(parquet).parent if parquet else None
    rows = [tokenize_row(tokenizer, row, where, processor=processor, base_dir=base) for where, row in prompts]
    ids = [list(row.prompt_ids) for row in rows]
    if processor is None or not any(row.images for row in rows):
        return ids, {}
    from rlhf_mcore.data.vision_prompt import PromptPixels

    return ids, {"images": PromptPixels(processor)(rows)}


def generate_run(cfg, prompts: list[tuple[str, object]], out: str, parquet: str = "") -> None:
    """Build the actor and its rollout engine, sample every prompt (a vision LM's with its images), print (rank 0)
    and write `out`."""
    from rlhf_mcore.logs import init_logger
    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.parallel import init_distributed, torchrun_env
    from rlhf_mcore.rollout.base import build_rollout_engine
    from rlhf_mcore.trainer.inputs import load_run_tokenizer, stop_token_ids
    from rlhf_mcore.trainer.phases import sampling_params
    from rlhf_mcore.trainer.roles import build_roles
    from rlhf_mcore.trainer.run import engine_setup

    init_logger(torchrun_env()[0])
    ctx = init_distributed(cfg.parallel.tp, cfg.parallel.pp, seed=cfg.trainer.seed,
                           timeout_min=cfg.parallel.collective_timeout_min, ep=cfg.parallel.ep)
    tokenizer = load_run_tokenizer(cfg)
    stop_ids = stop_token_ids(cfg, tokenizer, announce=ctx.is_logging_rank)
    hf_config = load_hf_config(cfg.model)
    roles = build_roles(cfg, hf_config, ctx)
    engine = build_rollout_engine(cfg.rollout, engine_setup(cfg, roles, hf_config, tokenizer, ctx))
    params = sampling_params(cfg, stop_ids, 0, validation=True)
    ids, pictures = prompt_inputs(cfg, tokenizer, prompts, parquet)
    batch = engine.generate(ids, params, show_progress=ctx.is_logging_rank, **pictures)
    engine.shutdown()
    if not ctx.is_logging_rank:
        return
    records = []
    for row in range(batch.tokens.size(0)):
        start, length = int(batch.prompt_lengths[row]), int(batch.response_lengths[row])
        text = tokenizer.decode(batch.tokens[row, start:start + length].tolist())
        messages = prompts[row // params.n][1].messages
        record = {"prompt": messages[-1]["content"], "sample": row % params.n, "response": text,
                  "finish_reason": batch.finish_reasons[row]}
        records.append(record)
        print(f"----- prompt {row // params.n} sample {record['sample']} ({record['finish_reason']}) -----\n"
              f"{record['prompt']}\n----- response -----\n{text}", flush=True)
    if out:
        with open(out + ".tmp", "w") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        os.replace(out + ".tmp", out)
        print(f"wrote {len(records)} samples to {out}", flush=True)


def main(argv=None) -> int:
    from rlhf_mcore import train
    from rlhf_mcore.evaluate import checkpoint_overrides

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m rlhf_mcore.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="global_step_N of a run, an HF dir or a megatron dir")
    parser.add_argument("--prompt", action="append", default=[], help="a user message (repeatable)")
    parser.add_argument("--image", action="append", default=[],
                        help="an image file for the next <image> of the --prompt messages (repeatable; vision LMs)")
    parser.add_argument("--prompts", default="", help="a parquet in verl's schema: its prompt (and images) column")
    parser.add_argument("--out", default="", help="also write the samples to this JSONL file")
    args, rest = parser.parse_known_args(argv)
    try:
        loads = checkpoint_overrides(args.checkpoint)
        prompts = read_prompts(args.prompt, args.image, args.prompts)
        if not prompts:
            raise ValueError("no prompts: pass --prompt TEXT (repeatable) or --prompts FILE.parquet")
    except (ValueError, OSError) as e:
        print(f"cannot start:\n  - {e}", file=sys.stderr)
        return 2
    return train.main([*rest, *loads], body=lambda cfg: generate_run(cfg, prompts, args.out, args.prompts))


if __name__ == "__main__":
    sys.exit(main())
