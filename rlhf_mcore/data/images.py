"""verl's multimodal rows: the `images` column and the `<image>` placeholders of the prompt.

A row's `images` is a list with one entry per `<image>` placeholder of its messages, in order. An entry is what
verl and HF `datasets` write: raw bytes (PNG, JPEG, ...), a dict `{"bytes": ..., "path": ...}` (the bytes win
when both are set) or a path (a string, or the dict's `path`). A relative path is looked up as given, then
next to the parquet file. `image_sources` checks the column's shape; `open_image` decodes one entry, with one
error naming the file, the row and the entry. Nothing here needs a model or a processor.

>>> image_sources([b"\\x89PNG", {"bytes": None, "path": "a.png"}, "b.jpg"], "x.parquet: row 0")
(b'\\x89PNG', 'a.png', 'b.jpg')
>>> count_placeholders([{"role": "user", "content": "<image>Which colour? <image>"}])
2
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"


def _fail(where: str, problem: str) -> None:
    raise ValueError(f"{where}: {problem}.")


def _source(entry: Any, where: str, k: int) -> bytes | str:
    if isinstance(entry, dict):
        data, path = entry.get("bytes"), entry.get("path")
        if data:
            return bytes(data)
        if isinstance(path, str) and path:
            return path
        _fail(where, f"images[{k}]: a dict needs non-empty 'bytes' or 'path' (got keys {sorted(entry)}). Write the "
                     "image's bytes or its path")
    if isinstance(entry, (bytes, bytearray, memoryview)) and len(entry):
        return bytes(entry)
    if isinstance(entry, str) and entry:
        return entry
    _fail(where, f"images[{k}]: must be image bytes, a path or a dict with 'bytes' / 'path' (got "
                 f"{type(entry).__name__} {str(entry)[:40]!r}). Write one entry per <image>")


def image_sources(value: Any, where: str) -> tuple[bytes | str, ...]:
    """A row's `images` column as a tuple of bytes / paths (() for None or an empty list)."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        _fail(where, f"images: must be a list of images (got {type(value).__name__}). Write a list, one per <image>")
    return tuple(_source(entry, where, k) for k, entry in enumerate(value))


def count_placeholders(messages: Sequence[dict], placeholder: str = IMAGE_PLACEHOLDER) -> int:
    return sum(m["content"].count(placeholder) for m in messages if isinstance(m.get("content"), str))


def check_placeholders(messages: Sequence[dict], num_images: int, where: str) -> None:
    """One `<image>` per image, and no `<video>` (videos are not supported)."""
    if count_placeholders(messages, VIDEO_PLACEHOLDER):
        _fail(where, "prompt: has a <video> placeholder; videos are not supported yet (images only). Drop the row "
                     "or give its frames as images")
    found = count_placeholders(messages)
    if found != num_images:
        _fail(where, f"prompt: has {found} <image> placeholder(s) for {num_images} image(s) in the images column "
                     f"(got {found}). Put one <image> in the prompt where each image goes")


def resolve_path(path: str, base_dir: str | Path | None) -> Path:
    """`path` as given when it exists, else next to the data file (`base_dir`)."""
    given = Path(path)
    if given.exists() or given.is_absolute() or base_dir is None:
        return given
    return Path(base_dir) / given


def open_image(source: bytes | str, where: str, base_dir: str | Path | None = None, k: int = 0):
    """The decoded RGB PIL image of one entry; a missing file or undecodable bytes raise one ValueError."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, str):
        path = resolve_path(source, base_dir)
        if not path.is_file():
            tried = "" if str(path) == source else f" (nor {path})"
            _fail(where, f"images[{k}]: file not found: {source}{tried}. Fix the path (a relative path is read from "
                         "the working directory, then next to the parquet file)")
        what, stream = str(path), open(path, "rb")
    else:
        what, stream = f"{len(source)} bytes", io.BytesIO(source)
    try:
        with stream, Image.open(stream) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
        _fail(where, f"images[{k}]: cannot decode the image ({what}: {type(err).__name__}: {str(err)[:120]}). "
                     "Write PNG or JPEG bytes, or the path of one")


def open_images(sources: Sequence[bytes | str], where: str, base_dir: str | Path | None = None) -> list:
    return [open_image(s, where, base_dir, k) for k, s in enumerate(sources)]
