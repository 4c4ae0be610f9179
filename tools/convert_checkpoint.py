"""Convert checkpoints between Hugging Face and megatron-core, and check that both compute the same thing.

    python -m tools.convert_checkpoint hf-to-mcore --hf-dir D --out O [--dtype auto|fp32|bf16] [--role R]
    torchrun --nproc_per_node 4 -m tools.convert_checkpoint hf-to-mcore --hf-dir D --out O --tp 2 --pp 2
    python -m tools.convert_checkpoint mcore-to-hf --mcore-dir O --out D2 [--max-shard-size 5GB]
    python -m tools.convert_checkpoint mcore-to-hf --mcore-dir run/global_step_100/actor --hf-config D --out D2
    torchrun --nproc_per_node 2 -m tools.convert_checkpoint verify --hf-dir D --mcore-dir O --tp 2
    torchrun --nproc_per_node 2 -m tools.convert_checkpoint hf-to-mcore --hf-dir MOE --out O --ep 2

`hf-to-mcore` writes a megatron dist-checkpoint that loads at any TP/PP/EP (megatron reshards on load; an MoE
model's experts are saved under their global index from any --ep), with
the HF config and tokenizer files in O/hf/. `mcore-to-hf` runs in one process and writes config.json,
model.safetensors (sharded with an index past --max-shard-size) and the tokenizer files. `verify` feeds
one random token batch through transformers (fp32) and through the megatron model at --tp/--pp, prints
the max and mean absolute differences of logits and of per-token log-probs, and exits 1 past --atol
(fp32 default 1e-4; a bf16 checkpoint may err at most 2x as much as transformers' own bf16). Every output
is written to a temporary directory and renamed at the end. Conversion maps: rlhf_mcore/models/weights.py.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path

import torch

from rlhf_mcore.convert.mcore import (
    HF_SUBDIR,
    build_for_conversion,
    describe_checkpoint,
    full_state_dict,
    load_converted,
    load_full_state_dict,
    needed_keys,
    read_converted,
    save_converted,
)
from rlhf_mcore.convert.vision_weights import split_vision, vision_for_export
from rlhf_mcore.models.hf_io import load_hf_state_dict, read_hf_config, save_hf_checkpoint
from rlhf_mcore.models.logprobs import full_logits
from rlhf_mcore.models.registry import spec_for_hf_config
from rlhf_mcore.models.weights import ROLES, default_role, hf_to_mcore, mcore_to_hf

log = logging.getLogger("convert_checkpoint")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FP32_ATOL = 1e-4
BF16_SLACK = 2.0  # bf16: our error against fp32 transformers may be at most 2x transformers' own bf16 error
SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'5GB' -> 5_000_000_000 (decimal units like transformers; KiB/MiB/GiB binary).

    >>> parse_size("5GB"), parse_size("64KiB"), parse_size("1000")
    (5000000000, 65536, 1000)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).upper() not in SIZE_UNITS:
        raise ValueError(f"--max-shard-size: cannot parse {text!r}. Use a size like 5GB or 500MB.")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])


def resolve_dtype(requested: str, hf_cfg: dict) -> str:
    """'auto' keeps the HF checkpoint's own dtype (bf16 stays bf16, anything else becomes fp32)."""
    if requested != "auto":
        return requested
    return "bf16" if (hf_cfg.get("dtype") or hf_cfg.get("torch_dtype")) == "bfloat16" else "fp32"


def step(message: str, start: float) -> None:
    log.info("[%6.1fs] %s", time.perf_counter() - start, message)


def hf_to_mcore_cmd(args) -> int:
    from rlhf_mcore.parallel import init_distributed

    start = time.perf_counter()
    hf_cfg = read_hf_config(args.hf_dir)
    role, dtype = args.role or default_role(hf_cfg), resolve_dtype(args.dtype, hf_cfg)
    spec = spec_for_hf_config(hf_cfg, f"{args.hf_dir}/config.json")
    ctx = init_distributed(args.tp, args.pp, ep=args.ep)
    step(f"building the {role} model at tp={args.tp} pp={args.pp} ep={args.ep} ({dtype})", start)
    model = build_for_conversion(hf_cfg, role, ctx, dtype, source=f"{args.hf_dir}/config.json")
    hf_sd, source = load_hf_state_dict(args.hf_dir, lazy=True, aliases=spec.checkpoint_aliases)
    step(f"converting {len(hf_sd)} HF tensors from {source} (this stage's only)", start)
    full = hf_to_mcore(hf_sd, hf_cfg, role=role, source=source, only=needed_keys(model))
    load_full_state_dict(model, full, ctx.tp_rank, ctx.dims.tp, source=source)
    vision = split_vision(hf_sd, hf_cfg, source)  # the tower: vision.safetensors beside the dist-checkpoint
    del hf_sd, full
    step(f"saving dist-checkpoint to {args.out}", start)
    meta = {"role": role, "dtype": dtype, "source": str(Path(args.hf_dir).resolve()), "saved_tp": args.tp,
            "saved_pp": args.pp, "saved_ep": args.ep, "padded_vocab_size": model.vocab_size}
    save_converted(model, args.out, args.hf_dir, meta, overwrite=args.overwrite, vision=vision)
    step(f"done: {args.out}", start)
    return 0


def export_config(hf_cfg: dict, role: str, dtype: str) -> dict:
    """The HF config to write beside exported weights: stored dtype, and a one-label head for scalar roles."""
    cfg = {k: v for k, v in hf_cfg.items() if k != "torch_dtype"}
    cfg["dtype"] = "bfloat16" if dtype == "bf16" else "float32"
    if role in ("critic", "reward"):
        spec = spec_for_hf_config(hf_cfg)
        cfg["architectures"] = [a for a in spec.architectures if a.endswith("ForSequenceClassification")]
        cfg["id2label"], cfg["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    return cfg


def mcore_to_hf_cmd(args) -> int:
    from rlhf_mcore.parallel import init_distributed, torchrun_env

    start = time.perf_counter()
    if torchrun_env()[2] != 1:
        raise ValueError("mcore-to-hf runs in one process (megatron reshards to TP1/PP1 on load). "
                         "Run it with python, not torchrun.")
    max_shard = parse_size(args.max_shard_size)
    hf_cfg, hf_dir, role, dtype = describe_checkpoint(args.mcore_dir, args.hf_config, args.role, args.dtype)
    ctx = init_distributed(1, 1)
    step(f"loading dist-checkpoint {args.mcore_dir} (role {role}, dtype {dtype})", start)
    model = build_for_conversion(hf_cfg, role, ctx, dtype, f"{hf_dir}/config.json")
    load_converted(model, args.mcore_dir)
    hf_sd = mcore_to_hf(full_state_dict(model), hf_cfg, role=role, source=str(args.mcore_dir))
    hf_sd.update(vision_for_export(hf_cfg, [args.mcore_dir, hf_dir], DTYPES[dtype], str(args.mcore_dir)))
    step(f"writing {len(hf_sd)} tensors to {args.out}", start)
    save_hf_checkpoint(args.out, hf_sd, export_config(hf_cfg, role, dtype), hf_dir, max_shard_bytes=max_shard,
                       overwrite=args.overwrite)
    step(f"done: {args.out}", start)
    return 0


def megatron_outputs(model, tokens: torch.Tensor):
    """Forward one batch through the pipeline; the last stage gets the model output [b, s, ...]."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    positions = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)

    def forward_step(data_iterator, chunk):
        return chunk(next(data_iterator), positions, attention_mask=None), None

    with torch.no_grad():
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter([tokens]), model=[model], num_microbatches=1,
            seq_length=tokens.size(1), micro_batch_size=tokens.size(0), forward_only=True,
        )
    return outputs[0] if outputs else None


def hf_outputs(hf_dir: str, role: str, dtype: str, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' logits [b, s, V] (LM roles) or per-token scalar head outputs [b, s, 1]."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    if role in ("actor", "ref"):
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=DTYPES[dtype]).eval()
        with torch.no_grad():
            return model(tokens).logits.float()
    model = AutoModelForSequenceClassification.from_pretrained(hf_dir, dtype=DTYPES[dtype]).eval()
    with torch.no_grad():  # per-token scores, before the last-token pooling
        return model.score(model.model(tokens).last_hidden_state).float()


def compare(ref: torch.Tensor, ours: torch.Tensor, tokens: torch.Tensor, lm: bool) -> dict[str, float]:
    stats = {"logits_max": (ref - ours).abs().max().item(), "logits_mean": (ref - ours).abs().mean().item()}
    if lm:  # log p(tokens[t+1] | tokens[:t+1])
        targets = tokens[:, 1:].unsqueeze(-1)
        lp_ref = torch.log_softmax(ref[:, :-1], -1).gather(-1, targets)
        lp_ours = torch.log_softmax(ours[:, :-1], -1).gather(-1, targets)
        stats.update(logprob_max=(lp_ref - lp_ours).abs().max().item(),
                     logprob_mean=(lp_ref - lp_ours).abs().mean().item())
    return stats


def tolerances(atol: float | None, stats: dict, baseline: dict | None) -> dict[str, float]:
    """Allowed value of each `*_max` statistic: --atol (default FP32_ATOL), or with a bf16 `baseline`
    (transformers' own bf16 forward against its fp32 forward) BF16_SLACK x that baseline."""
    keys = [k for k in stats if k.endswith("_max")]
    if baseline is None:
        return dict.fromkeys(keys, FP32_ATOL if atol is None else atol)
    return {k: BF16_SLACK * baseline[k] for k in keys}


def verify_cmd(args) -> int:
    """Collective. Prints one `verify ckpt=... PASS|FAIL` line; every rank returns 1 past --atol, else 0."""
    import torch.distributed as dist

    from rlhf_mcore.parallel import init_distributed

    hf_cfg, meta = read_converted(args.mcore_dir)
    role, dtype = meta["role"], meta["dtype"]
    if spec_for_hf_config(hf_cfg).vision_prefix is not None:
        raise ValueError(f"{args.mcore_dir}: verify compares text-only forwards, not a vision model's (got "
                         f"{hf_cfg.get('model_type')}). Export it with mcore-to-hf and compare in transformers.")
    if role in ("critic", "reward") and default_role(read_hf_config(args.hf_dir)) != "reward":
        raise ValueError(f"{args.hf_dir}: verify compares a {role} head only against a "
                         "*ForSequenceClassification checkpoint (a causal LM has no score head).")
    ctx = init_distributed(args.tp, args.pp, ep=args.ep)
    model = build_for_conversion(hf_cfg, role, ctx, dtype, f"{args.mcore_dir}/{HF_SUBDIR}")
    load_converted(model, args.mcore_dir)
    model.eval()
    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, hf_cfg["vocab_size"], (args.batch_size, args.seq_len), generator=gen)  # [B, T]
    failed = torch.zeros(1)
    output = megatron_outputs(model, tokens)
    if ctx.is_last_stage:
        lm = role in ("actor", "ref")
        ours = full_logits(model, output, ctx.pgs.tp).float() if lm else output.float()
        if ctx.tp_rank == 0 and ctx.dp_rank == 0:
            reference = hf_outputs(args.hf_dir, role, "fp32", tokens)  # fp32 transformers is the truth
            stats = compare(reference, ours, tokens, lm)
            baseline = None
            if dtype == "bf16" and args.atol is None:
                baseline = compare(reference, hf_outputs(args.hf_dir, role, dtype, tokens), tokens, lm)
            limits = tolerances(args.atol, stats, baseline)
            ok = all(stats[k] <= limit for k, limit in limits.items())
            fields = dict(ckpt=Path(args.mcore_dir).name, tp=args.tp, pp=args.pp, ep=args.ep, role=role, dtype=dtype)
            fields.update({k: f"{v:.3e}" for k, v in stats.items()})
            fields.update({f"tol_{k.removesuffix('_max')}": f"{v:.3e}" for k, v in limits.items()})
            print("verify " + " ".join(f"{k}={v}" for k, v in fields.items()), "PASS" if ok else "FAIL", flush=True)
            failed += 0 if ok else 1
    dist.all_reduce(failed)
    return int(failed.item() > 0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    to_mcore = sub.add_parser("hf-to-mcore", help="HF directory -> megatron dist-checkpoint")
    to_mcore.add_argument("--hf-dir", required=True)
    to_mcore.add_argument("--out", required=True)
    to_mcore.add_argument("--dtype", choices=("auto", *DTYPES), default="auto")
    to_mcore.add_argument("--role", choices=ROLES,
                          help="default: reward for *ForSequenceClassification, else actor")
    to_hf = sub.add_parser("mcore-to-hf", help="megatron dist-checkpoint -> HF directory")
    to_hf.add_argument("--mcore-dir", required=True)
    to_hf.add_argument("--out", required=True)
    to_hf.add_argument("--max-shard-size", default="5GB")
    to_hf.add_argument("--hf-config", help="HF dir with config.json + tokenizer (default: MCORE_DIR/hf); needed "
                       "for a training checkpoint's role dir, e.g. run/global_step_100/actor")
    to_hf.add_argument("--role", choices=ROLES, help="default: from conversion.json, else the directory name")
    to_hf.add_argument("--dtype", choices=tuple(DTYPES), help="default: from conversion.json, else fp32")
    verify = sub.add_parser("verify", help="compare transformers and megatron outputs on one random batch")
    verify.add_argument("--hf-dir", required=True)
    verify.add_argument("--mcore-dir", required=True)
    verify.add_argument("--seq-len", type=int, default=32)
    verify.add_argument("--batch-size", type=int, default=2)
    verify.add_argument("--seed", type=int, default=0)
    verify.add_argument("--atol", type=float, help=f"max abs diff allowed (default fp32: {FP32_ATOL}; bf16: "
                        f"{BF16_SLACK}x transformers' own bf16-vs-fp32 error)")
    for p in (to_mcore, verify):
        p.add_argument("--tp", type=int, default=1)
        p.add_argument("--pp", type=int, default=1)
        p.add_argument("--ep", type=int, default=1, help="expert parallelism (MoE models; divides the experts)")
    for p in (to_mcore, to_hf):
        p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    return parser.parse_args(argv)


def run(argv: list[str] | None = None) -> int:
    """Run one subcommand in this process; raises ValueError on bad input. Leaves the process groups up
    (callers that convert several checkpoints, such as tests, reuse them)."""
    args = parse_args(argv)
    command = {"hf-to-mcore": hf_to_mcore_cmd, "mcore-to-hf": mcore_to_hf_cmd, "verify": verify_cmd}
    return command[args.command](args)


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    from rlhf_mcore.logs import heartbeat, init_logger
    from rlhf_mcore.parallel import destroy_distributed, torchrun_env

    init_logger(torchrun_env()[0])
    owns_groups = not dist.is_initialized()
    try:
        with heartbeat("convert_checkpoint", enabled=torchrun_env()[0] == 0):
            return run(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    finally:
        if owns_groups:
            destroy_distributed()


if __name__ == "__main__":
    sys.exit(main())
