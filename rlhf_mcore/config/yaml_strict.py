"""Reading a config file as a user may hand it over: one line for every way it can be wrong.

`read_config_file(path)` refuses a directory, a file too large to be a config, bytes that are not UTF-8, a
YAML syntax error, a key given twice in one mapping (YAML keeps the last one silently), nesting deeper than
any config needs, and anchors/aliases that would expand past `MAX_NODES` nodes (a "billion laughs" file is
refused while it is still a small graph, before anything is built from it). Every refusal is a
`YamlError` whose message is one line: "--config: <path>: <problem>. <fix>."

>>> load_strict("a: 1\\nb: {c: 2}")
{'a': 1, 'b': {'c': 2}}
>>> load_strict("a: 1\\na: 2")
Traceback (most recent call last):
...
rlhf_mcore.config.yaml_strict.YamlError: line 2: key 'a' is given twice (first on line 1). Keep one of them
"""
from __future__ import annotations

import os

import yaml

MAX_BYTES = 4 << 20  # a config is a few KiB; the largest verl overrides file is well under this
MAX_DEPTH = 24  # sections nest 3 deep in the schema
MAX_NODES = 200_000  # scalars, lists and mappings after expanding every alias


class YamlError(ValueError):
    """One line: what is wrong with the YAML text."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (naming the key and both lines)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.setdefault(key, line)
                except TypeError:  # an unhashable key: SafeLoader reports it
                    continue
                if first != line:
                    raise YamlError(f"line {line}: key {key!r} is given twice (first on line {first}). "
                                    "Keep one of them")
        return super().construct_mapping(node, deep=deep)


def _check_size(root) -> None:
    """Depth and expanded size of a composed node graph, each node counted once per path reaching it (aliases
    share nodes, so this is cheap: memoised on the node)."""
    sizes: dict[int, int] = {}

    def size(node, depth: int) -> int:
        if depth > MAX_DEPTH:
            line = node.start_mark.line + 1
            raise YamlError(f"line {line}: nested more than {MAX_DEPTH} levels deep. A config nests sections a "
                            "few levels deep; flatten it")
        if id(node) in sizes:
            return sizes[id(node)]
        children = [] if isinstance(node, yaml.ScalarNode) else \
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else node.value
        total = 1
        for child in children:
            total += size(child, depth + 1)
            if total > MAX_NODES:
                raise YamlError(f"its anchors and aliases expand to more than {MAX_NODES} values (a YAML bomb?). "
                                "Write the values out, or use fewer aliases")
        sizes[id(node)] = total
        return total

    size(root, 0)


def load_strict(text: str):
    """The YAML document in `text` (None when empty), or a YamlError."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise YamlError(f"{where}not valid YAML ({problem}). Fix the syntax there") from None
    except RecursionError:
        raise YamlError(f"nested more than {MAX_DEPTH} levels deep. A config nests sections a few levels deep; "
                        "flatten it") from None
    finally:
        loader.dispose()


def read_config_file(path: str):
    """The parsed YAML of the file at `path`; FileNotFoundError, or YamlError naming the path."""
    if os.path.isdir(path):
        raise YamlError(f"--config: {path} is a directory (got {path!r}). Pass a YAML file, e.g. from configs/.")
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise YamlError(f"--config: {path} is larger than {MAX_BYTES >> 20} MiB (got {path!r}). Pass a YAML "
                        "config, not a data file.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        bad = raw[e.start:e.start + 1]
        raise YamlError(f"--config: {path}: byte {e.start} (line {line}) is not UTF-8 (got {bad!r}). Save the file "
                        "as UTF-8.") from None
    try:
        return load_strict(text)
    except YamlError as e:
        raise YamlError(f"--config: {path}: {e}.") from None
