"""ModelDeployment files as ``kvgate validate`` and ``kvgate plan -f`` read them: bounded.

The webhook is sent JSON of at most 1 MiB (``limits.MAX_REQUEST_BYTES``), and JSON has no
aliases. A YAML file does: ten aliases to a list of ten aliases, nine levels deep, are a billion
strings in a few hundred bytes, and building them took 21 s and 2 GB before being denied as a
kvgate bug. So a file is read up to the same 1 MiB, composed into YAML nodes (an alias stays one
shared node: cheap), and refused when its aliases would expand it past what a 1 MiB request could
carry, or when an alias refers to itself; only then are Python objects built from it. The
webhook's JSON and these files meet the same bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from kvgate_engine.command_inputs import InputError, decode_text, read_bytes
from kvgate_engine.untrusted import BodyLimits

from kvgate.admission.limits import MAX_REQUEST_BYTES

MANIFEST_LIMITS = BodyLimits.for_bytes(MAX_REQUEST_BYTES)
# Flow collections ([ or {) open at once. A ModelDeployment written as JSON nests about 8 deep.
# PyYAML's scanner keeps a possible key per open level and walks them all at every token, so
# 5,000 levels (10 KB) took 1.7 s of CPU before the composer gave up on them (10 s on a loaded
# machine); the bound refuses them at the 101st.
MAX_FLOW_NESTING = 100
MANIFEST_FILE = "a ModelDeployment YAML or JSON file"
REQUEST_CAP = "the webhook's request cap"
_N = TypeVar("_N", bound=yaml.Node)


class _AliasTooDeep(Exception):
    def __init__(self, anchor: str) -> None:
        super().__init__(anchor)
        self.anchor = anchor


class _FlowTooDeep(Exception):
    pass


class _Loader(yaml.SafeLoader):
    """The safe loader, remembering which anchor names each node, so a message can name one,
    and refusing flow collections nested past ``MAX_FLOW_NESTING``."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.anchor_names: dict[int, str] = {}

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        if self.flow_level >= MAX_FLOW_NESTING:
            raise _FlowTooDeep
        super().fetch_flow_collection_start(TokenClass)

    def compose_scalar_node(self, anchor: Any) -> yaml.ScalarNode:
        return self._named(super().compose_scalar_node(anchor), anchor)

    def compose_sequence_node(self, anchor: Any) -> yaml.SequenceNode:
        return self._named(super().compose_sequence_node(anchor), anchor)

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        return self._named(super().compose_mapping_node(anchor), anchor)

    def _named(self, node: _N, anchor: object) -> _N:
        if isinstance(anchor, str):
            self.anchor_names[id(node)] = anchor
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def expanded_values(root: yaml.Node, anchors: dict[int, str], limit: int) -> tuple[int, int]:
    """(values once every alias is expanded, capped at limit + 1; distinct nodes). Iterative,
    each node visited once however often it is aliased; _AliasTooDeep on a node that contains
    itself."""
    sizes: dict[int, int] = {}
    entered: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            entered.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            sizes[key] = min(total, limit + 1)
            continue
        if key in sizes:
            continue
        entered.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in entered:  # an ancestor: the document refers to itself
                raise _AliasTooDeep(anchors.get(id(child), "an anchor"))
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)], len(sizes)


def flow_nesting_exceeded(text: str) -> bool:
    """Does the YAML text open more than ``MAX_FLOW_NESTING`` flow collections at once? Scans
    tokens only, so a deep document costs milliseconds; a syntax error is left to the loader
    that reads the text after this."""
    if text.count("[") + text.count("{") <= MAX_FLOW_NESTING:
        return False  # most files: no scan at all
    loader = _Loader(text)
    try:
        while loader.check_token():
            loader.get_token()  # type: ignore[no-untyped-call]
    except _FlowTooDeep:
        return True
    except yaml.YAMLError:
        return False
    finally:
        loader.dispose()
    return False


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} at line {mark.line + 1} column {mark.column + 1}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def load_manifests(path: str, *, input_name: str) -> list[Any]:
    """Every document in the file (``-``: standard input), empty ones skipped; InputError, naming
    ``input_name`` (the path, or ``-f``), when the file cannot be read as YAML within the caps."""
    data = read_bytes(
        path,
        input_name=input_name,
        max_bytes=MAX_REQUEST_BYTES,
        what=MANIFEST_FILE,
        cap=REQUEST_CAP,
    )
    text = decode_text(data, input_name=input_name, path=path, what=MANIFEST_FILE)
    where = "" if input_name == path else f"{path}: "  # before "document N ..."
    lead = "" if input_name == path else f"{path} "  # before "is ..."
    loader = _Loader(text)
    at = _Position()
    try:
        documents = _documents(loader, at, input_name=input_name, where=where)
    except _AliasTooDeep as alias:
        raise InputError(
            input_name,
            f"{where}document {at.index} refers to itself through a YAML alias "
            f"(*{alias.anchor}); no ModelDeployment contains itself: write the values out",
        ) from None
    except _FlowTooDeep:
        raise InputError(
            input_name,
            f"{where}document {at.index} opens more than {MAX_FLOW_NESTING} flow collections "
            "([ or {) inside each other; kvgate reads at most that many (a ModelDeployment needs "
            "about 8): flatten it",
        ) from None
    except RecursionError:
        raise InputError(
            input_name, f"{where}document {at.index} is nested too deeply to read; flatten it"
        ) from None
    except yaml.YAMLError as error:
        raise InputError(
            input_name, f"{lead}is not YAML ({_yaml_problem(error)}); pass {MANIFEST_FILE}"
        ) from None
    finally:
        loader.dispose()
    if not documents:
        raise InputError(input_name, f"{lead}holds no document; pass a ModelDeployment")
    return documents


@dataclass
class _Position:
    index: int = 0  # the document being read, also while check_node scans ahead into it


def _documents(loader: _Loader, at: _Position, *, input_name: str, where: str) -> list[Any]:
    """Every non-empty document the loader holds, each within MANIFEST_LIMITS' values once its
    aliases are expanded."""
    limit = MANIFEST_LIMITS.max_values
    documents: list[Any] = []
    while True:
        at.index += 1
        if not loader.check_node():
            return documents
        loader.anchor_names = {}
        node = loader.get_node()
        if node is None:
            continue
        values, distinct = expanded_values(node, loader.anchor_names, limit)
        if values > limit and distinct <= limit:
            raise InputError(
                input_name,
                f"{where}document {at.index} expands to more than {limit:,} values through YAML "
                f"aliases (*name); kvgate reads at most what a 1 MiB request could hold: "
                "write the values out, or use fewer aliases",
            )
        if values > limit:
            raise InputError(
                input_name,
                f"{where}document {at.index} holds more than {limit:,} values, more than a 1 MiB "
                f"request could; pass {MANIFEST_FILE} of one ModelDeployment",
            )
        document = loader.construct_document(node)
        if document is not None:
            documents.append(document)


def document_name(document: Any, index: int) -> str:
    """How a command names the ``index``-th document of a file: ``Kind/name``, or its position."""
    if isinstance(document, dict):
        metadata = document.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
            return f"{document.get('kind', 'document')}/{metadata['name']}"
    return f"document {index + 1}"
