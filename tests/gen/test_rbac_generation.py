"""The operator's RBAC has one source, kvgate.gen.rbac: the chart's rules and operator/RBAC.md are
generated from it (`make crds`), and every object kind kvgate's client addresses has a rule."""

from __future__ import annotations

import ast
import inspect
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from kvgate.api.models import ModelDeployment
from kvgate.gen import rbacgen
from kvgate.gen.rbac import RULES, Scope, granted, rules
from kvgate.kube.k8s import KubeApi
from kvgate.objects import builders

ROOT = Path(__file__).resolve().parents[2]


def test_chart_rules_are_generated_from_the_table() -> None:
    committed = (ROOT / rbacgen.RULES_TEMPLATE).read_text()
    assert committed == rbacgen.chart_rules_template(), (
        f"{rbacgen.RULES_TEMPLATE} drifted from operator/kvgate/gen/rbac.py: run `make crds`"
    )


def test_rbac_md_table_is_generated_from_the_table() -> None:
    doc = (ROOT / rbacgen.RBAC_DOC).read_text()
    assert rbacgen.doc_table() in doc, (
        f"{rbacgen.RBAC_DOC} drifted from operator/kvgate/gen/rbac.py: run `make crds`"
    )


def test_check_names_a_drifted_file_and_writes_nothing(tmp_path: Path) -> None:
    for rel in (rbacgen.RULES_TEMPLATE, rbacgen.RBAC_DOC):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    check = [sys.executable, "-m", "kvgate.gen.rbacgen", "--root", str(tmp_path), "--check"]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0

    template = tmp_path / rbacgen.RULES_TEMPLATE
    # Any rule's verbs widened by hand (the first rule's, whatever the table grants there).
    edited = re.sub(r"verbs: \[[^\]]*\]", 'verbs: ["*"]', template.read_text(), count=1)
    assert edited != template.read_text()
    template.write_text(edited)
    result = subprocess.run(check, capture_output=True, text=True)
    assert result.returncode == 1
    assert f"{template} is out of date" in result.stderr
    assert template.read_text() == edited  # --check wrote nothing

    assert rbacgen.main(["--root", str(tmp_path)]) == 0
    assert template.read_text() == rbacgen.chart_rules_template()


def test_a_doc_without_the_markers_is_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="markers"):
        rbacgen.doc_with_table("# RBAC\n| API group | ... |\n")


def _client_kinds() -> list[str]:
    """Every kind kvgate.kube.k8s.KubeApi.path knows (the keys of its table, read from the
    source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(KubeApi.path)))
    tables = [node for node in ast.walk(tree) if isinstance(node, ast.Dict)]
    kinds = [k.value for t in tables for k in t.keys if isinstance(k, ast.Constant)]
    assert len(kinds) >= 10, kinds
    return [str(k) for k in kinds]


def _client_resources() -> set[tuple[str, str]]:
    """(apiGroup, resource) of every kind kvgate.kube.k8s.KubeApi can address."""
    found = set()
    for kind in _client_kinds():
        parts = KubeApi.path(kind, "ns").split("/")
        group = "" if parts[1] == "api" else parts[2]
        found.add((group, parts[-1]))
    return found


def test_every_kind_the_client_addresses_has_a_rule() -> None:
    table = granted(list(RULES))  # optional rules (e.g. LeaderWorkerSets) count too
    missing = sorted(_client_resources() - set(table))
    assert missing == [], (
        f"kvgate.kube.k8s addresses {missing} with no rule: add a Rule with the verbs the operator "
        "calls to kvgate.gen.rbac.RULES and run `make crds` (chart and operator/RBAC.md follow)"
    )
    # The two status writes go to subresources.
    assert table[("", "pods/status")] == {"patch"}
    assert table[("kvgate.io", "modeldeployments/status")] == {"patch"}


def test_no_rule_grants_a_wildcard_or_a_duplicate() -> None:
    seen: set[tuple[str, str, Scope]] = set()
    for rule in RULES:
        assert "*" not in (rule.group, *rule.resources, *rule.verbs)
        assert len(set(rule.verbs)) == len(rule.verbs)
        for resource in rule.resources:
            assert (rule.group, resource, rule.scope) not in seen
            seen.add((rule.group, resource, rule.scope))


def test_the_operator_holds_every_right_the_router_role_it_creates_grants() -> None:
    # RBAC's escalation check: creating a Role needs every right it grants (or `escalate`, which
    # kvgate does not ask for); without pods get the API server refuses the router Role (403).
    doc = yaml.safe_load((ROOT / "crds" / "samples" / "llama-8b.yaml").read_text())
    doc["metadata"] = {"name": "llama", "namespace": "models", "uid": "u"}
    role = builders.router_role(ModelDeployment.model_validate(doc))
    held = granted(rules(Scope.NAMESPACED))
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                missing = set(rule["verbs"]) - held.get((group, resource), set())
                assert not missing, (
                    f"the router Role grants {sorted(missing)} on {resource!r}, which "
                    "kvgate.gen.rbac.RULES does not give the operator"
                )
