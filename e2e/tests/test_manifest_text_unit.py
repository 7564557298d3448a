"""What the e2e harness hands ``kubectl -f -`` (kvgate_e2e.world.manifest_text)."""

from __future__ import annotations

import json

import yaml
from kvgate_e2e.world import manifest_text

# A 12-hex-digit key fingerprint that is digits around one "e": kubectl's YAML reader (Go, YAML
# 1.1 floats) reads it unquoted as a number; PyYAML leaves it unquoted.
FINGERPRINT = "123456e78901"
POD = {"metadata": {"name": "p", "annotations": {"kvgate.io/router-key-fingerprint": FINGERPRINT}}}


def test_pyyaml_leaves_a_fingerprint_that_reads_as_a_number_unquoted() -> None:
    # Why manifest_text is not yaml.safe_dump: this line is a float to kubectl.
    assert f"kvgate.io/router-key-fingerprint: {FINGERPRINT}\n" in yaml.safe_dump(POD)


def test_a_copied_pods_annotations_reach_kubectl_as_strings() -> None:
    text = manifest_text(POD)
    assert f'"{FINGERPRINT}"' in text
    assert json.loads(text) == POD
    assert yaml.safe_load(text) == POD  # JSON is YAML: kubectl -f - reads it as it is
