"""The run's tokenizer (HF dir, SentencePiece model, or `bytes` for tiny models) and its prompt samplers."""
from __future__ import annotations

import logging
import math

from rlhf_mcore.tokenizer_bytes import ByteTokenizer

log = logging.getLogger(__name__)


def load_run_tokenizer(cfg):
    path = cfg.model.tokenizer or cfg.model.hf_path
    if path == "bytes":
        return ByteTokenizer()
    if not path:
        raise ValueError("model.tokenizer: no tokenizer (got ''). Set model.hf_path, model.tokenizer to a tokenizer "
                         "dir or .model file, or model.tokenizer=bytes for a tiny byte-level model.")
    from rlhf_mcore.tokenizer import load_tokenizer

    return load_tokenizer(path)


def stop_token_ids(cfg, tokenizer, announce: bool = False) -> tuple[int, ...]:
    """The stop set (`rlhf_mcore.stop_tokens`): the tokenizer's eos, generation_config.json's and config.json's
    eos ids and the chat template's end-of-turn token; both engines stop at any of them. `announce` (rank 0, at
    start-up): log the set, and one warning when the tokenizer's eos is not the model config's."""
    from rlhf_mcore.stop_tokens import describe, eos_disagreement, stop_set, stop_sources

    sources = stop_sources(tokenizer, cfg.model.hf_path)
    ids = stop_set(sources)
    if announce:
        text = lambda i: token_text(tokenizer, i)  # noqa: E731
        warning = eos_disagreement(sources, text)
        if warning:
            log.warning(warning)
        log.info(describe(ids, text))
    return ids


def token_text(tokenizer, token_id: int) -> str:
    """One token's text, special tokens included (the byte tokenizer's eos has none)."""
    try:
        return tokenizer.decode([token_id], skip_special_tokens=False)
    except TypeError:
        return tokenizer.decode([token_id])


def prompt_tools(cfg) -> list[dict]:
    """The function schemas prompts are rendered with: rollout.multi_turn's tools (multi_turn), else none."""
    if cfg.rollout.mode != "multi_turn":
        return []
    from rlhf_mcore.agent.tools import load_tools, tool_schemas

    m = cfg.rollout.multi_turn
    return tool_schemas(load_tools(list(m.tools), m.tools_file or None).values())


def vision_processor(cfg):
    """The image processor and vision tokens of a vision-language policy (`data.vision_prompt`), None for a text
    model (its rows must have no images)."""
    if not cfg.model.hf_path:
        return None
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.registry import spec_for_hf_config

    hf = read_hf_config(cfg.model.hf_path)
    if spec_for_hf_config(hf, f"{cfg.model.hf_path}/config.json").vision_prefix is None:
        return None
    from rlhf_mcore.data.vision_prompt import VisionProcessor

    return VisionProcessor.from_hf_dir(cfg.model.hf_path, hf)


def prompt_pixels(cfg):
    """A vision LM's prompts -> their pixels (`data.vision_prompt.PromptPixels`), None for a text model."""
    processor = vision_processor(cfg)
    if processor is None:
        return None
    from rlhf_mcore.data.vision_prompt import PromptPixels

    return PromptPixels(processor)


def _load(paths: str, tokenizer, cfg):
    from rlhf_mcore.data.dataset import load_prompt_dataset

    dataset = load_prompt_dataset(paths.split(","), tokenizer, cfg.data.max_prompt_length,
                                  filter_overlong=cfg.data.filter_overlong_prompts, tools=prompt_tools(cfg),
                                  processor=vision_processor(cfg))
    log.info("data: %d prompts from %s (%d longer than %d tokens filtered out)", len(dataset), paths,
             dataset.num_filtered, cfg.data.max_prompt_length)
    return dataset


def build_samplers(cfg, tokenizer, ctx):
    """(training PromptSampler for this DP rank, ValidationSampler or None)."""
    from rlhf_mcore.data import PromptSampler, ValidationSampler

    sampler = PromptSampler(_load(cfg.data.train_files, tokenizer, cfg), cfg.data.train_batch_size,
                            dp_rank=ctx.dp_rank, dp_size=ctx.dims.dp, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle,
                            mini_batch_size=math.gcd(cfg.actor.ppo_mini_batch_size, cfg.critic.ppo_mini_batch_size))
    val = ValidationSampler(_load(cfg.data.val_files, tokenizer, cfg), dp_rank=ctx.dp_rank, dp_size=ctx.dims.dp) \
        if cfg.data.val_files else None
    return sampler, val
