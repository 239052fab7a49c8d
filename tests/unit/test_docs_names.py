"""The docs name batchsched's PodGroups in forms that cannot reach Volcano's,
and install the CRD folder the way kubectl accepts it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "e2e" / "README.md", *(ROOT / "docs").glob("*.md"),
                    *(ROOT / "examples").glob("*.yaml"), *(ROOT / "e2e").rglob("*.sh")])
# A kubectl resource argument naming PodGroups ambiguously: pg, podgroup(s) alone or as podgroup/NAME.
AMBIGUOUS = re.compile(r"kubectl\b[^\n`#]*?[\s,](pg|podgroups?)(?=[\s,/`]|$)", re.M)


def test_the_crd_does_not_take_volcanos_short_name():
    names = yaml.safe_load((ROOT / "crds" / "podgroup.yaml").read_text())["spec"]["names"]
    assert "pg" not in names["shortNames"] and "bspg" in names["shortNames"]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_kubectl_commands_name_podgroups_unambiguously_and_apply_crds_with_k(path):
    text = path.read_text()
    assert [m.group(0) for m in AMBIGUOUS.finditer(text)] == []
    assert "-f crds/" not in text  # crds/ holds a kustomization.yaml, which `apply -f` refuses
