"""docs/multinode.md: its annotated sample is the shipped file, and admission admits it while the
same model on one node is denied with the numbers the doc quotes."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml
from kvgate.admission import check_document

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "crds" / "samples" / "llama-405b-multinode.yaml"


def _section() -> str:
    return (ROOT / "docs" / "multinode.md").read_text()


def test_doc_sample_is_the_shipped_multi_node_sample() -> None:
    (block,) = re.findall(r"```yaml\n(.*?)```", _section(), flags=re.S)
    assert block == SAMPLE.read_text()


def test_multi_node_sample_is_admitted_and_one_node_is_denied_as_the_doc_says() -> None:
    doc = yaml.safe_load(SAMPLE.read_text())
    assert check_document(doc).allowed
    one_node = copy.deepcopy(doc)
    for role in ("prefill", "decode"):
        one_node["spec"][role] |= {"nodes": 1, "tensorParallel": 8}
    result = check_document(one_node)
    assert not result.allowed
    assert "94.50 GiB per GPU" in result.message and "67.15 GiB per GPU" in result.message
    assert "94.5 GiB per GPU > 67.15 GiB" in _section()
