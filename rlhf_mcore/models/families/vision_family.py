"""What the vision-language families share (`qwen2_5_vl.py`, `qwen3_vl.py`): their config.json's LM fields flat,
the M-RoPE section, and the run settings no vision LM takes yet. A leaf: it imports nothing of ours.

config.json nests the LM's fields under `text_config` (transformers >= 5) or keeps them at the top level (the Hub's
Qwen2.5-VL files); `text_config` flattens both.
"""


# Qwen3-VL's checkpoints (dense and MoE) nest the LM as `model.language_model.*` and the tower as `model.visual.*`,
# where the weight table reads `model.*` and `visual.*`; transformers loads only the nested names
NESTED_ALIASES = (("model.language_model.", "model."), ("model.visual.", "visual."))
NESTED_EXPORT = (("model.", "model.language_model."), ("visual.", "model.visual."))


def rope_fields(hf: dict) -> list[tuple[str, dict]]:
    return [(f, hf[f]) for f in ("rope_parameters", "rope_scaling") if isinstance(hf.get(f), dict)]


def text_config(hf: dict) -> dict:
    """The LM's fields flat (the top level wins over `text_config`); HF's rope type "mrope" is the default
    frequencies (transformers maps it so too). Idempotent.

    >>> flat = text_config({"model_type": "qwen2_5_vl", "text_config": {"model_type": "qwen2_5_vl_text",
    ...     "hidden_size": 64, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}})
    >>> flat["model_type"], flat["hidden_size"], flat["rope_scaling"]
    ('qwen2_5_vl', 64, {'mrope_section': [2, 3, 3], 'rope_type': 'default'})
    """
    text = {k: v for k, v in (hf.get("text_config") or {}).items() if k != "model_type"}
    flat = {**text, **{k: v for k, v in hf.items() if k != "text_config"}}
    for field, params in rope_fields(flat):
        if params.get("rope_type", params.get("type")) == "mrope":
            flat[field] = {**{k: v for k, v in params.items() if k != "type"}, "rope_type": "default"}
    return flat


def mrope_section(hf: dict) -> list[int] | None:
    """The rotary frequencies per axis (temporal, height, width) of a flat config."""
    for _, params in rope_fields(hf):
        if params.get("mrope_section"):
            return list(params["mrope_section"])
    return None


def mrope_errors(hf: dict, source: str, section: list[int] | None, name: str) -> list[str]:
    """A vision LM's config.json checks, one line each: three M-RoPE counts summing to head_dim / 2, default rope
    frequencies, and a `vision_config`."""
    heads = hf.get("num_attention_heads") or 1
    half = (hf.get("head_dim") or (hf.get("hidden_size") or 0) // heads) // 2
    errs = []
    if not section or len(section) != 3 or sum(section) != half:
        errs.append(f"{source}: rope_parameters.mrope_section must be three counts summing to head_dim / 2 = {half} "
                    f"(got {section}). Use the model's own config.json.")
    kind = next((p.get("rope_type", p.get("type")) for _, p in rope_fields(hf)), "default")
    if kind not in (None, "default"):
        errs.append(f"{source}: rope type {kind!r} with M-RoPE is not supported for {name} (got {kind}). "
                    "Use a model with default M-RoPE.")
    if not isinstance(hf.get("vision_config"), dict):
        errs.append(f"{source}: vision_config is missing (got {hf.get('vision_config')!r}). Point model.hf_path at a "
                    f"{name} directory.")
    return errs


def layout_errors(parallel, name: str) -> list[str]:
    """No sequence parallelism for now: the image embeddings replace token rows before the decoder, whole along the
    sequence (`models.vision`). Pipeline stages: the first runs the tower, every stage the M-RoPE positions."""
    errs = []
    if parallel.sequence_parallel:
        errs.append(f"parallel.sequence_parallel: not yet with {name} (got true). Set it to false.")
    return errs


# what a run with a vision LM cannot take yet: (setting is on, error line; {name}: the family's name)
RUN_LIMITS = (
    (lambda c: not c.model.hf_path, "model.hf_path: {name} is built from its HF directory (its vision_config "
     "and preprocessor_config.json) (got ''). Set model.hf_path (model.init=random for random weights)."),
    (lambda c: c.parallel.pp > 1 and not c.model.freeze_vision_tower, "model.freeze_vision_tower: a trained tower "
     "runs at parallel.pp=1 only for now (got false at parallel.pp={c.parallel.pp}): its copies on later stages would "
     "drift. Set model.freeze_vision_tower=true, or parallel.pp=1."),
    (lambda c: bool(c.reward.model_path), "reward.model_path: a text reward model cannot score image prompts (got "
     "{c.reward.model_path}). Use rule rewards (reward.custom_fn or a data_source)."),
)


def vision_run_errors(cfg, name: str) -> list[str]:
    """The layout's errors and the run settings not supported yet with images (`RUN_LIMITS`)."""
    return layout_errors(cfg.parallel, name) + [line.format(c=cfg, name=name) for on, line in RUN_LIMITS if on(cfg)]
