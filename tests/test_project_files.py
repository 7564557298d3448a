"""The files a project people install is expected to carry: a license that matches what the
package and the image declare, a private way to report a vulnerability, and a changelog whose
newest version is the version everything else ships."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_the_license_file_is_the_apache_license_the_package_declares() -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"


def test_the_security_policy_gives_a_private_reporting_path_and_no_public_one() -> None:
    text = (REPO / "docs/SECURITY.md").read_text()
    assert "https://github.com/kvgate/kvgate/security/advisories/new" in text
    assert "never in a public issue" in text
    assert "threat-model.md" in text


def test_the_changelogs_newest_version_is_the_version_the_package_chart_and_image_ship() -> None:
    newest = re.search(r"^## (\S+)", (REPO / "docs/changelog.md").read_text(), re.M)
    assert newest
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((REPO / "charts/kvgate/Chart.yaml").read_text())
    assert newest.group(1) == project["version"] == chart["version"] == chart["appVersion"]
