"""A vision-language model (Qwen2.5-VL, Qwen3-VL): megatron's GPTModel with M-RoPE for the language model
(`models.build`, families `qwen2_5_vl`, `qwen3_vl`) and transformers' own vision tower and merger as a plain torch
module on every rank.

The tower is the family's transformers class (`ModelSpec.vision_tower`) built from config.json's `vision_config`
and loaded from the checkpoint's `visual.*` tensors (or `model.visual.*`), frozen by default. A forward
(`vision_lm_forward`; the trainer's `models.vision_step`, the native engine's `rollout.vision_decode`):
1. the tower turns pixel_values [num_patches, C * T * P * P] of the batch's images (grids `image_grid_thw`) into
   one embedding per merged patch [num_image_tokens, hidden] (Qwen3-VL: and one per DeepStack level, carried along
   the last dim);
2. the LM's word embeddings of input_ids [B, S], with the `<|image_pad|>` tokens' rows replaced by those, in order
   (transformers' `masked_scatter`), go to the decoder as `decoder_input` (`merge_images`, which also stages the
   DeepStack levels that forward hooks add after LM layers 0 .. n-1);
3. positions are M-RoPE's [3, B, S] (`models.mrope`), which megatron's `MultimodalRotaryEmbedding` turns into the
   rotary table its attention applies (sections as transformers' tables: contiguous for Qwen2.5-VL, interleaved
   chunks for Qwen3-VL).
Rows are right-padded (the attention is causal; padding sees only what precedes it). No sequence parallelism for
now (`families.vision_family.RUN_LIMITS`); videos are refused.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from rlhf_mcore.models.mrope import mrope_position_ids

VISION_FILE = "vision.safetensors"  # a converted checkpoint's tower, beside its dist-checkpoint (convert/)
DEFAULT_TOKENS = {"image_token_id": 151655, "video_token_id": 151656}  # transformers' Qwen2_5_VLConfig defaults


def tower_class(hf: dict) -> type:
    """transformers' tower class of config.json's family (`ModelSpec.vision_tower`)."""
    from rlhf_mcore.models.registry import spec_for_hf_config

    return spec_for_hf_config(hf).vision_tower()


def build_vision_tower(hf: dict, dtype: torch.dtype, device, attention: str = "sdpa") -> torch.nn.Module:
    """transformers' vision tower + merger of config.json's `vision_config` (random weights until loaded)."""
    cls = tower_class(hf)
    config = cls.config_class(**hf["vision_config"])  # the modeling code's own config of that dict
    config._attn_implementation = attention
    return cls(config).to(device=device, dtype=dtype).eval()


@torch.no_grad()
def load_vision_weights(tower: torch.nn.Module, sd, prefix: str, source: str) -> int:
    """Copy the checkpoint's `prefix*` tensors (sd: a `hf_io.LazyStateDict` with the family's aliases) into the
    tower; returns how many. Missing or unexpected names are one ValueError."""
    state = {k[len(prefix):]: sd[k] for k in sd if k.startswith(prefix)}
    own = tower.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"{source}: vision tower tensors do not match vision_config (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}). Use the checkpoint its config.json belongs to.")
    bad = [k for k in state if tuple(state[k].shape) != tuple(own[k].shape)]
    if bad:
        key = bad[0]
        raise ValueError(f"{source}: vision tower tensor '{prefix}{key}' has shape {list(state[key].shape)}, "
                         f"expected {list(own[key].shape)} from vision_config. Use the checkpoint's own config.json.")
    for key, tensor in state.items():
        own[key].copy_(tensor)
    return len(state)


@dataclasses.dataclass
class VisionLM:
    """This rank's language model (GPTModel, M-RoPE) and the vision tower, with the token ids they share."""

    lm: torch.nn.Module
    tower: torch.nn.Module
    image_token_id: int
    video_token_id: int
    merge: int  # the merger's spatial_merge_size

    @classmethod
    def from_parts(cls, lm, tower, hf: dict) -> "VisionLM":
        tokens = {k: hf.get(k, v) for k, v in DEFAULT_TOKENS.items()}
        return cls(lm, tower, merge=hf["vision_config"].get("spatial_merge_size", 2), **tokens)


@dataclasses.dataclass
class VisionSide:
    """What a vision LM's forward needs besides the LM, held on the GPTModel as `model.vision` (a plain attribute:
    a frozen tower stays out of the LM's state dict, checkpoints and weight sync; a trained one is also the
    registered submodule `vision_tower`, so DDP, the optimizer and checkpoints see its parameters)."""

    tower: torch.nn.Module
    image_token_id: int
    video_token_id: int
    merge: int
    # DeepStack (Qwen3-VL): the features the hooks add after LM layers 0 .. levels - 1, staged by `merge_images`
    # for the next forward of the first stage: (sequence index, batch index, features [levels, N, h]), or None
    pending: tuple | None = dataclasses.field(default=None, repr=False)
    hooks: list = dataclasses.field(default_factory=list, repr=False)


TOWER_NAME = "vision_tower"  # the submodule name of a trained tower (its parameters' prefix in the LM)


def attach_tower(lm: torch.nn.Module, tower: torch.nn.Module, hf: dict, trainable: bool) -> None:
    """Give `lm` (this rank's GPTModel, its weights loaded) the tower: frozen unless `trainable`."""
    tokens = {k: hf.get(k, v) for k, v in DEFAULT_TOKENS.items()}
    tower.requires_grad_(trainable)
    old = getattr(lm, "vision", None)
    for handle in old.hooks if old is not None else ():
        handle.remove()
    lm.vision = side = VisionSide(tower, merge=hf["vision_config"].get("spatial_merge_size", 2), **tokens)
    levels = deepstack_levels(tower)
    for layer in getattr(getattr(lm, "decoder", None), "layers", ()) if levels else ():
        if layer.layer_number - 1 >= levels:  # global, 1-based
            continue
        if not getattr(lm, "pre_process", True):  # the features exist on the first stage only, with the tower
            raise ValueError(f"parallel.pp: DeepStack adds the tower's features after LM layers 0..{levels - 1}, "
                             f"which must all sit on the first pipeline stage (got layer {layer.layer_number - 1} on a "
                             "later stage). Use fewer pipeline stages.")
        side.hooks.append(layer.register_forward_hook(functools.partial(add_deepstack, side, layer.layer_number - 1)))
    if trainable:
        lm.add_module(TOWER_NAME, tower)


def deepstack_levels(tower) -> int:
    """How many DeepStack levels the tower returns (Qwen3-VL's `deepstack_visual_indexes`; 0 for Qwen2.5-VL)."""
    return len(getattr(tower, "deepstack_visual_indexes", None) or ())


def add_deepstack(side: VisionSide, level: int, layer, args, output):
    """Forward hook of LM layer `level`: its output hidden states [s, b, h] plus DeepStack level `level` at the
    image tokens (transformers' `_deepstack_process` after decoder layer k), out of place; unchanged without
    staged features (text, decode steps)."""
    if side.pending is None:
        return output
    hidden, context = output
    s_idx, b_idx, features = side.pending
    added = hidden.index_put((s_idx, b_idx), hidden[s_idx, b_idx] + features[level].to(hidden.dtype))
    return added, context


def save_tower(directory, model, prefix: str = "visual.") -> bool:
    """Write the tower of `model` (a vision LM's role, frozen or trained) as `directory/vision.safetensors` under
    its HF names, where the HF export (`convert.vision_weights`) and a later run's `model.load` find it; False (and
    nothing written) for a text model."""
    from pathlib import Path

    from safetensors.torch import save_file

    side = vision_side(model)
    if side is None:
        return False
    state = {f"{prefix}{k}": v.detach().cpu().contiguous() for k, v in side.tower.state_dict().items()}
    save_file(state, str(Path(directory) / VISION_FILE), metadata={"format": "pt"})
    return True


def vision_side(model) -> VisionSide | None:
    """The `VisionSide` of a (possibly DDP-wrapped) model chunk, None for a text model."""
    while not hasattr(model, "vision") and hasattr(model, "module"):
        model = model.module
    return getattr(model, "vision", None)


def tower_weights(hf: dict, dirs: list, prefix: str, aliases: tuple = ()) -> dict | None:
    """The tower's tensors (names without `prefix`) from the first of `dirs` holding them: a converted
    checkpoint's vision.safetensors (`convert.vision_weights`), else an HF directory's weights; None if none has."""
    from pathlib import Path

    from safetensors.torch import load_file

    from rlhf_mcore.models.hf_io import LazyStateDict, weight_files

    for directory in [Path(d) for d in dirs if d and Path(d).is_dir()]:
        if (directory / VISION_FILE).is_file():
            sd = load_file(str(directory / VISION_FILE))
        else:
            try:
                sd = LazyStateDict(weight_files(directory), aliases)
            except ValueError:
                continue
        state = {k[len(prefix):]: sd[k] for k in sd if k.startswith(prefix)}
        if state:
            return state
    return None


def build_run_tower(hf: dict, model_cfg, device, dtype: torch.dtype, seed: int) -> tuple[torch.nn.Module, str]:
    """(the tower, where its weights came from) for a run: model.load's vision.safetensors or model.hf_path's
    weights, else (model.init=random) transformers' initialisation under `seed`, the same on every rank."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tower = build_vision_tower(hf, torch.float32, "cpu")
    from rlhf_mcore.models.registry import spec_for_hf_config

    spec = spec_for_hf_config(hf)
    dirs = [] if model_cfg.init == "random" else [model_cfg.load, model_cfg.hf_path]
    state = tower_weights(hf, dirs, spec.vision_prefix, spec.checkpoint_aliases) if dirs else None
    if dirs and state is None:
        raise ValueError(f"model.hf_path: no vision tower weights ('visual.*') in {[d for d in dirs if d]}. Use the "
                         "model's HF directory with its weights, or set model.init=random.")
    if state is not None:
        missing = sorted(set(tower.state_dict()) - set(state))
        if missing:
            raise ValueError(f"model.hf_path: vision tower tensors missing ({missing[:3]}). Use the checkpoint that "
                             "config.json belongs to.")
        tower.load_state_dict(state, strict=True)
    where = "random (model.init=random)" if state is None else f"from {next(d for d in dirs if d)}"
    return tower.to(device=device, dtype=dtype).eval(), where


def build_vision_lm(hf_dir: str, role: str, model_cfg, parallel_cfg, ctx, train_vision: bool = False) -> VisionLM:
    """Build and load a Qwen2.5-VL checkpoint directory at this rank's layout: the LM through `models.build` and
    `models.hf_load` (this rank's TP slice), the tower whole; the tower frozen unless `train_vision`."""
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.families.vision_family import layout_errors
    from rlhf_mcore.models.hf_io import LazyStateDict, read_hf_config, weight_files
    from rlhf_mcore.models.hf_load import load_hf_weights
    from rlhf_mcore.models.registry import spec_for_hf_config

    hf = read_hf_config(hf_dir)
    spec = spec_for_hf_config(hf, f"{hf_dir}/config.json")
    if spec.vision_prefix is None:
        raise ValueError(f"model.hf_path: {spec.name} has no vision tower (got {hf_dir}). Use a vision model.")
    errs = layout_errors(parallel_cfg, spec.name)  # the family by its registry name
    if errs:
        raise ValueError(errs[0])
    lm = build_model(role, hf, model_cfg, parallel_cfg, ctx, source=f"{hf_dir}/config.json")
    load_hf_weights(lm, hf_dir, hf, ctx.tp_rank, ctx.dims.tp)
    tower = build_vision_tower(hf, next(lm.parameters()).dtype, ctx.device)
    files = weight_files(hf_dir)
    load_vision_weights(tower, LazyStateDict(files, spec.checkpoint_aliases), spec.vision_prefix, str(files[0]))
    attach_tower(lm, tower, hf, trainable=train_vision)  # DeepStack's hooks too (Qwen3-VL)
    return VisionLM.from_parts(lm, tower, hf)


def image_embeddings(tower: torch.nn.Module, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
    """[num_image_tokens, out_hidden x (1 + DeepStack levels)] from pixel_values [num_patches, C*T*P*P] and grids
    [num_images, 3] (no graph when the tower is frozen): the merged embeddings, then each DeepStack level (Qwen3-VL)
    along the last dim, so that splitting and reordering image tokens (per row, per prompt) carries them all."""
    frozen = not any(p.requires_grad for p in tower.parameters())
    with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
        out = tower(pixel_values.to(next(tower.parameters()).dtype), grid_thw=image_grid_thw)
    levels = getattr(out, "deepstack_features", None) or []
    return torch.cat([out.pooler_output, *levels], dim=-1) if levels else out.pooler_output


def merge_images(side: VisionSide, embeddings: torch.Tensor, input_ids: torch.Tensor,
                 images: torch.Tensor | None) -> torch.Tensor:
    """`merge_image_embeddings` of `image_embeddings`' main part, and its DeepStack levels staged on `side` for this
    forward's hooks (cleared when `images` is None: a text batch or a decode step)."""
    if images is None:
        side.pending = None
        return embeddings
    hidden = embeddings.size(-1)
    merged = merge_image_embeddings(embeddings, input_ids, images[:, :hidden], side.image_token_id)
    side.pending = None
    if images.size(1) > hidden:
        b_idx, s_idx = (input_ids == side.image_token_id).nonzero(as_tuple=True)  # row-major, as the features
        side.pending = (s_idx, b_idx, images[:, hidden:].unflatten(1, (-1, hidden)).transpose(0, 1))
    return merged


def merge_image_embeddings(embeddings: torch.Tensor, input_ids: torch.Tensor, images: torch.Tensor,
                           image_token_id: int) -> torch.Tensor:
    """embeddings [S, B, h] (megatron's layout) with the image tokens' rows replaced by `images` [N, h], in the
    batch's row-major token order (transformers' masked_scatter over [B, S]).

    >>> emb = torch.zeros(3, 2, 1)
    >>> merge_image_embeddings(emb, torch.tensor([[5, 9, 9], [9, 5, 5]]), torch.tensor([[1.], [2.], [3.]]), 9)[..., 0].T
    tensor([[0., 1., 2.],
            [3., 0., 0.]])
    """
    mask = input_ids == image_token_id  # [B, S]
    if int(mask.sum()) != images.size(0):
        raise ValueError(f"input_ids: {int(mask.sum())} image tokens for {images.size(0)} image embeddings. Give "
                         "each image as many <|image_pad|> tokens as its grid says.")
    batch_first = embeddings.transpose(0, 1)  # [B, S, h]
    merged = batch_first.masked_scatter(mask[..., None], images.to(batch_first.dtype))
    return merged.transpose(0, 1).contiguous()


def check_right_padded(attention_mask: torch.Tensor) -> None:
    """Every row's tokens first, then its padding (the causal attention needs no mask for that)."""
    mask = attention_mask.long()
    if (mask[:, 1:] > mask[:, :-1]).any():
        raise ValueError("attention_mask: a row has a token after padding. Pad the rows on the right.")


def vision_lm_forward(vlm: VisionLM, input_ids: torch.Tensor, pixel_values: torch.Tensor | None = None,
                      image_grid_thw: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None):
    """The LM's output (hidden states [B, S, h] for an actor / ref's `HiddenStatesHead`) of a right-padded batch
    input_ids [B, S] (attention_mask [B, S], 1 = token) with its images (pixel_values, image_grid_thw)."""
    if (input_ids == vlm.video_token_id).any():
        raise ValueError("input_ids: video tokens are not supported yet (images only). Use images.")
    if attention_mask is not None:
        check_right_padded(attention_mask)
    embeddings = vlm.lm.embedding(input_ids=input_ids, position_ids=None)  # [S, B, h], whole over TP
    if pixel_values is None and (input_ids == vlm.image_token_id).any():
        raise ValueError("input_ids: image tokens without pixel_values. Pass the images with their tokens.")
    images = None if pixel_values is None else image_embeddings(vlm.tower, pixel_values, image_grid_thw)
    embeddings = merge_images(vision_side(vlm.lm), embeddings, input_ids, images)
    positions, _ = mrope_position_ids(input_ids, image_grid_thw, vlm.image_token_id, vlm.merge, attention_mask)
    return vlm.lm(input_ids, positions, None, decoder_input=embeddings)
