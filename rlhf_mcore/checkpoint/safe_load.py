"""Loading a checkpoint never runs code from it.

torch's dist-checkpoint reader, which megatron's `dist_checkpointing` uses, unpickles a checkpoint's `.metadata`
with `pickle.load` and its byte items with `torch.load(weights_only=False)`. A planted `.metadata` (a foreign
checkpoint given to `model.load`, or a run directory someone could write to, resumed by `trainer.resume=auto`)
would run a command at load. The checksums in `checkpoint.json` cannot stop that: they travel with the data they
protect.

- `check_loadable(dir)` reads `.metadata` with an unpickler that admits only what a checkpoint's metadata holds
  (`ADMITTED`: torch's checkpoint dataclasses, sizes, dtypes and layouts) and every byte item with
  `torch.load(weights_only=True)`. Anything else is a CheckpointError of one line that names the file, or the
  item, and what it asked for. Every loader calls it before megatron reads the directory.
- `install()` (called by `check_loadable`) replaces the two readers inside torch, process-wide, with the same
  restricted ones, so that no code path that reaches them unpickles more than this admits.

megatron reads common.pt (its non-sharded state) with `torch.load`'s default, weights_only since torch 2.6;
check_loadable reads it so too, for the one-line refusal, and refuses to load at all when
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD tells torch otherwise.
"""
from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path

import torch

from rlhf_mcore.checkpoint.layout import CheckpointError

METADATA_FILE, COMMON_FILE = ".metadata", "common.pt"
# module -> names a checkpoint's .metadata may ask for (torch dtypes are admitted by type, below)
ADMITTED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.planner": {"SavePlan", "WriteItem", "WriteItemType", "TensorWriteData"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name (torch.strided)
    "torch": {"Size"},
    "collections": {"OrderedDict"},
}


def admitted(module: str, name: str) -> bool:
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return True
    return name in ADMITTED.get(module, ())


class MetadataUnpickler(pickle.Unpickler):
    """pickle.Unpickler that resolves only ADMITTED globals; `source` names the file in the refusal."""

    def __init__(self, file, source: str):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str):
        if not admitted(module, name):
            raise CheckpointError(
                f"{self.source}: refused to load: it asks for {module}.{name}, which a checkpoint's metadata never "
                "holds (unpickling it could run code). Load only checkpoints you wrote or trust.")
        return super().find_class(module, name)


def read_metadata_file(path: Path):
    with open(path, "rb") as f:
        return MetadataUnpickler(f, str(path)).load()


def load_byte_item(value: io.BytesIO, source: str, map_location=None):
    """A byte item's object, through torch.load(weights_only=True): tensors, containers and plain values only.
    `map_location` as torch.load's: "cpu" reads a checkpoint written on a GPU where none is (e.g. the HF export)."""
    try:
        return torch.load(value, weights_only=True, map_location=map_location)
    except pickle.UnpicklingError as e:
        asked = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", str(e))
        what = f"it asks for {asked[1]}" if asked else "it is more than tensors and plain values"
        raise CheckpointError(f"{source}: refused to load: {what}, which torch.load(weights_only=True) does not "
                              "admit (unpickling it could run code). Load only checkpoints you wrote or trust.") from e


def _byte_items(ckpt_dir: Path, metadata) -> list[tuple[str, io.BytesIO]]:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    out = []
    for index, info in (getattr(metadata, "storage_data", None) or {}).items():
        if isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            with open(ckpt_dir / info.relative_path, "rb") as f:
                f.seek(info.offset)
                out.append((f"{ckpt_dir / info.relative_path} ({index.fqn})", io.BytesIO(f.read(info.length))))
    return out


def check_loadable(ckpt_dir) -> None:
    """Refuse, in one line, a dist-checkpoint directory whose metadata or byte items would run code when read."""
    install()
    ckpt_dir = Path(ckpt_dir)
    if os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0") not in ("", "0"):
        raise CheckpointError("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: torch.load would unpickle any object in "
                              f"{ckpt_dir / 'common.pt'}. Unset it to load checkpoints.")
    if not (ckpt_dir / METADATA_FILE).is_file():
        return  # not a dist-checkpoint: the caller's own checks say so
    metadata = read_metadata_file(ckpt_dir / METADATA_FILE)
    for source, value in _byte_items(ckpt_dir, metadata):  # read to check only: on the host
        load_byte_item(value, source, "cpu")
    if (ckpt_dir / COMMON_FILE).is_file():  # megatron reads it weights_only too, but with a traceback
        load_byte_item(io.BytesIO((ckpt_dir / COMMON_FILE).read_bytes()), str(ckpt_dir / COMMON_FILE), "cpu")


def _read_metadata(self, *args, **kwargs):
    """FileSystemReader.read_metadata with MetadataUnpickler (torch's body otherwise)."""
    from torch.distributed.checkpoint.metadata import StorageMeta

    path = self._get_metadata_path(kwargs.get("rank"))
    with self.fs.create_stream(path, "rb") as f:
        metadata = MetadataUnpickler(f, str(path)).load()
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = self.load_id
    return metadata


def _load_bytes(self, read_item, value: io.BytesIO) -> None:
    """DefaultLoadPlanner.load_bytes with torch.load(weights_only=True) (torch's body otherwise)."""
    from torch.distributed.checkpoint._traverse import set_element

    obj = load_byte_item(value, read_item.dest_index.fqn, None if torch.cuda.is_available() else "cpu")
    if self.flatten_state_dict:
        set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
    else:
        self.state_dict[read_item.dest_index.fqn] = obj


def install() -> None:
    """Put the restricted readers into torch's FileSystemReader and DefaultLoadPlanner (idempotent)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    FileSystemReader.read_metadata = _read_metadata
    DefaultLoadPlanner.load_bytes = _load_bytes
