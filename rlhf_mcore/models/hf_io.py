"""Reading and writing Hugging Face checkpoint directories, without building an HF model.

A directory holds `config.json`, weights as `model.safetensors` (or shards listed in
`model.safetensors.index.json`; `pytorch_model.bin` is read too), and tokenizer / generation files that
are copied through unchanged. Every write goes to a temporary sibling directory that is renamed into
place at the end, so a crash never leaves a half-written checkpoint behind.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlhf_mcore.disk import publish_dir
from rlhf_mcore.models.fused_experts import DOWN, GATE_UP, ExpertView, expert_views, fuse_experts

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN_FILE = "pytorch_model.bin"
MAX_SHARD_BYTES = 5 * 1024**3  # transformers' default `max_shard_size="5GB"` (binary GiB here)
# Copied verbatim beside converted weights: tokenizer, chat template, generation defaults.
AUX_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
    "generation_config.json", "preprocessor_config.json", "processor_config.json",  # a vision LM's image processor
)


def read_hf_config(hf_dir: str | os.PathLike) -> dict:
    """config.json of an HF checkpoint directory, as a dict."""
    path = Path(hf_dir) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no config.json. Pass a Hugging Face checkpoint directory.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}).") from err


def weight_files(hf_dir: str | os.PathLike) -> list[Path]:
    """The weight files of a directory: one safetensors file, the shards of an index, or a torch .bin."""
    hf_dir = Path(hf_dir)
    index = hf_dir / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no 'weight_map' entries.")
        files = [hf_dir / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index}: lists shards that do not exist: {', '.join(missing)}.")
        return files
    for name in (SAFETENSORS_FILE, TORCH_BIN_FILE):
        if (hf_dir / name).is_file():
            return [hf_dir / name]
    raise ValueError(
        f"{hf_dir}: no weights found (looked for {SAFETENSORS_INDEX}, {SAFETENSORS_FILE}, {TORCH_BIN_FILE})."
    )


def open_weight_file(path: Path):
    """A safetensors handle (header read, no tensor) or a memory-mapped torch state dict; a truncated or garbage
    file is a ValueError that names it."""
    try:
        if path.suffix == ".safetensors":
            return safe_open(str(path), framework="pt")
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - SafetensorError, RuntimeError, UnpicklingError: all say "damaged"
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a readable weight file ({reason}). Download or convert it again.") from e


def check_weight_files(hf_dir: str | os.PathLike) -> None:
    """Open every safetensors file's header (no tensor is read: cheap), so that a truncated or garbage shard is
    named before any model is built."""
    for path in weight_files(hf_dir):
        if path.suffix == ".safetensors":
            open_weight_file(path)


def canonical_name(name: str, aliases: tuple[tuple[str, str], ...]) -> str:
    """`name` with the first matching alias prefix replaced by its canonical one (`ModelSpec.checkpoint_aliases`).

    >>> canonical_name("model.language_model.norm.weight", (("model.language_model.", "model."),))
    'model.norm.weight'
    """
    for alias, canonical in aliases:
        if name.startswith(alias):
            return canonical + name[len(alias):]
    return name


class LazyStateDict(Mapping):
    """name -> tensor over checkpoint files, each tensor read only when accessed (torch .bin files are
    memory-mapped). Lets a pipeline stage convert just its own layers of a large checkpoint. `aliases`: (prefix,
    canonical prefix) pairs; a tensor stored under an alias prefix is found under the canonical name. Experts stored
    fused (`models.fused_experts`) are listed and read as per-expert tensors, one expert's bytes at a time."""

    def __init__(self, files: list[Path], aliases: tuple[tuple[str, str], ...] = ()):
        self._handles: dict[str, tuple[object, str]] = {}  # name -> (file handle, the name stored there)
        for path in files:
            handle = open_weight_file(path)
            for stored in handle.keys():
                name = canonical_name(stored, aliases)
                if name in self._handles:
                    raise ValueError(f"{path}: tensor '{stored}' also appears in another shard (as '{name}').")
                self._handles[name] = (handle, stored)
        fused = {n: self._stored_shape(n) for n in self._handles if n.endswith((GATE_UP, DOWN))}
        self._views = expert_views(fused)
        self._hidden = {v.stored for v in self._views.values()}  # read through the views only
        self._names = [n for n in self._handles if n not in self._hidden] + list(self._views)

    def _stored_shape(self, name: str) -> tuple[int, ...]:
        handle, name = self._handles[name]
        return tuple(handle[name].shape) if isinstance(handle, dict) else tuple(handle.get_slice(name).get_shape())

    def _view(self, view: ExpertView) -> torch.Tensor:
        handle, name = self._handles[view.stored]
        matrix = handle[name][view.expert] if isinstance(handle, dict) else \
            handle.get_slice(name)[view.expert:view.expert + 1][0]
        return view.take(matrix)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._views:
            return self._view(self._views[name])
        handle, name = self._handles[name]
        return handle[name] if isinstance(handle, dict) else handle.get_tensor(name)

    def __contains__(self, name) -> bool:
        return name in self._views or (name in self._handles and name not in self._hidden)

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape, without reading the tensor."""
        if name in self._views:
            return self._views[name].shape(self._stored_shape(self._views[name].stored))
        return self._stored_shape(name)

    def read_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows (dim 0) or columns (dim 1) [start, stop) of a tensor; safetensors reads only those bytes (a fused
        expert's view: that expert's)."""
        if name in self._views:
            return self[name].narrow(dim, start, stop - start).clone()
        handle, name = self._handles[name]
        if isinstance(handle, dict):
            return handle[name].narrow(dim, start, stop - start).clone()
        part = handle.get_slice(name)
        return part[start:stop] if dim == 0 else part[:, start:stop]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def load_hf_state_dict(hf_dir: str | os.PathLike, lazy: bool = False,
                       aliases: tuple[tuple[str, str], ...] = ()) -> tuple[Mapping[str, torch.Tensor], str]:
    """(name -> tensor, description of the source files) for every tensor of an HF checkpoint dir;
    `lazy` reads each tensor on first access instead of all up front; `aliases` as `LazyStateDict`'s."""
    files = weight_files(hf_dir)
    tensors = LazyStateDict(files, aliases)
    source = str(files[0]) if len(files) == 1 else f"{files[0].parent}/{SAFETENSORS_INDEX}"
    return (tensors if lazy else dict(tensors.items())), source


def plan_shards(state_dict: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names grouped into shards of at most `max_shard_bytes` (a larger single tensor stands alone).

    >>> sd = {n: torch.zeros(4) for n in "abc"}  # 16 bytes each
    >>> plan_shards(sd, 32)
    [['a', 'b'], ['c']]
    """
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def save_safetensors(
    out_dir: Path, state_dict: dict[str, torch.Tensor], max_shard_bytes: int = MAX_SHARD_BYTES
) -> list[str]:
    """Write `model.safetensors`, or numbered shards plus `model.safetensors.index.json` past the limit."""
    # safetensors refuses tensors that share storage (tied weights) or are not contiguous.
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()}
    shards = plan_shards(tensors, max_shard_bytes)
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(tensors, str(out_dir / SAFETENSORS_FILE), metadata=metadata)
        return [SAFETENSORS_FILE]
    names, weight_map = [], {}
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in shard}, str(out_dir / name), metadata=metadata)
        log.info("wrote shard %s (%d tensors)", name, len(shard))
        weight_map.update({k: name for k in shard})
        names.append(name)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names + [SAFETENSORS_INDEX]


def copy_aux_files(src_dir: str | os.PathLike, dst_dir: str | os.PathLike) -> list[str]:
    """Copy tokenizer / chat-template / generation files that exist in `src_dir`; returns their names."""
    copied = []
    for name in AUX_FILES:
        src = Path(src_dir) / name
        if src.is_file():
            shutil.copy2(src, Path(dst_dir) / name)
            copied.append(name)
    return copied


def update_generation_config(out_dir: str | os.PathLike, fields: dict) -> None:
    """Set `fields` in out_dir's generation_config.json, keeping its other fields (a new file when missing)."""
    path = Path(out_dir) / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.unlink(missing_ok=True)  # a copy keeps its source's mode, which may be read-only
    path.write_text(json.dumps({**config, **fields}, indent=2, sort_keys=True) + "\n")


def write_config(out_dir: str | os.PathLike, hf_config: dict) -> None:
    (Path(out_dir) / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary sibling of `out_dir`; on success publish it as `out_dir` (`disk.publish_dir`), on
    error delete it.

    An existing non-empty `out_dir` is an error unless `overwrite`, in which case it is replaced only
    after the new directory is complete.
    """
    out_dir = Path(out_dir).resolve()
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise ValueError(
            f"{out_dir}: already exists and is not empty. Pass --overwrite or choose another --out."
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; the result is shared like any other output
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, out_dir)


def export_tensors(state_dict: dict, hf_config: dict) -> dict:
    """The state dict as the family's checkpoints store it: experts fused in the Hub's layout where the family's are
    (`ModelSpec.fused_experts`, `models.fused_experts`), then the export prefixes (`ModelSpec.export_prefixes`):
    Qwen3-VL's transformers class loads its LM only as `model.language_model.*` and its tower as `model.visual.*` (no
    legacy-name conversion, unlike Qwen2.5-VL's), where the weight table reads `model.*` and `visual.*`. Other
    families: unchanged.

    >>> export_tensors({"model.norm.weight": 1, "visual.pos_embed.weight": 2, "lm_head.weight": 3},
    ...                {"architectures": ["Qwen3VLForConditionalGeneration"]})
    {'model.language_model.norm.weight': 1, 'model.visual.pos_embed.weight': 2, 'lm_head.weight': 3}
    """
    from rlhf_mcore.models.registry import spec_for_hf_config

    spec = spec_for_hf_config(hf_config)
    if spec.fused_experts:
        state_dict = fuse_experts(state_dict)
    if not spec.export_prefixes:
        return state_dict
    renamed = {}
    for name, tensor in state_dict.items():
        new = next((to + name[len(old):] for old, to in spec.export_prefixes if name.startswith(old)), name)
        renamed[new] = tensor
    return renamed


def save_hf_checkpoint(
    out_dir: str | os.PathLike,
    state_dict: dict[str, torch.Tensor],
    hf_config: dict,
    aux_src_dir: str | os.PathLike | list | None = None,
    *,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    overwrite: bool = False,
    generation: dict | None = None,
) -> Path:
    """Write a complete HF checkpoint directory atomically: config, weights (under the names the family's
    transformers class loads, `export_tensors`), and aux files copied over (from each of `aux_src_dir`'s directories
    in turn: a later one's files win). `generation`: fields set in generation_config.json (written when missing)."""
    sources = aux_src_dir if isinstance(aux_src_dir, list) else [aux_src_dir] if aux_src_dir is not None else []
    state_dict = export_tensors(state_dict, hf_config)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        for src in sources:
            copy_aux_files(src, tmp)
        if generation:
            update_generation_config(tmp, generation)
        write_config(tmp, hf_config)
        save_safetensors(tmp, state_dict, max_shard_bytes)
    return Path(out_dir)
