"""The shape render Checkov scans (tests/infra/scan.py), and the inline skips it honours.

Checkov itself runs in CI (`python -m tests.infra.scan`, .ci/run) from its own environment; these
tests hold what the scan's verdict rests on without it: each shape's copy says exactly what that
shape deploys, and every skip in the templates names one check and says why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.infra import checks, scan

TEMPLATE = """\
param vnetEnabled bool = false
resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_59: public shape only: the apps have no private path then
  // checkov:skip=CKV_AZURE_206: any shape: says why
  properties: {
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled' // a comment: vnetEnabled ? x : y
    sku: vnetEnabled ? premiumSku : standard.sku
  }
}
module network 'app/network.bicep' = if (vnetEnabled) {
  params: {
    vnetEnabled: vnetEnabled
  }
}
output VNET_ENABLED bool = vnetEnabled
"""


@pytest.mark.parametrize(
    ("shape", "access", "sku"),
    [("public", "'Enabled'", "standard.sku"), ("private", "'Disabled'", "premiumSku")],
)
def test_each_shape_takes_its_branch(shape, access, sku):
    rendered = scan.render_text(TEMPLATE, shape)
    assert f"publicNetworkAccess: {access} // a comment: vnetEnabled ? x : y" in rendered
    assert f"sku: {sku}\n" in rendered
    assert "vnetEnabled ?" not in rendered.split("//")[0]
    # What Checkov does not read stays as written.
    for kept in ("param vnetEnabled bool", "vnetEnabled: vnetEnabled", "if (vnetEnabled)"):
        assert kept in rendered


def test_a_skip_for_one_shape_only_is_dropped_from_the_others():
    public, private = (scan.render_text(TEMPLATE, shape) for shape in ("public", "private"))
    assert "CKV_AZURE_59" in public and "CKV_AZURE_59" not in private
    assert "CKV_AZURE_206" in public and "CKV_AZURE_206" in private


@pytest.mark.parametrize(
    "line",
    [
        "    publicNetworkAccess: !vnetEnabled ? 'Enabled' : 'Disabled'",
        "    networkAcls: vnetEnabled ? {",
        "    x: vnetEnabled && zoneRedundant ? 'a' : 'b'",
        "resource r 'T@1' = if (vnetEnabled && other) {",
        "var private = vnetEnabled",
        "    x: y == vnetEnabled ? 'a' : 'b'",
        "    x: vnetEnabled ? 'a' : 'b' && z",
    ],
)
def test_a_use_the_render_cannot_fold_fails_it(line):
    with pytest.raises(scan.RenderError, match=r"main.bicep:2: cannot fold this use"):
        scan.render_text(f"param vnetEnabled bool = false\n{line}\n", "public", "main.bicep")


def test_a_skip_for_an_unknown_shape_fails_the_render():
    text = "  // checkov:skip=CKV_AZURE_1: staging shape only: no such shape\n"
    with pytest.raises(scan.RenderError, match="no shape 'staging'"):
        scan.render_text(text, "public", "x.bicep")


@pytest.mark.parametrize("shape", list(checks.SHAPES))
def test_the_templates_render_in_each_shape(tmp_path, shape):
    written = scan.render(checks.REPO_ROOT, shape, tmp_path / "infra")
    names = {str(path.relative_to(tmp_path / "infra")) for path in written}
    network = {"app/network.bicep", "app/private-endpoint.bicep"}
    assert "main.bicep" in names and "app/function.bicep" in names
    assert (network <= names) if shape == "private" else not (network & names)
    for path in written:
        code = "\n".join(line.split("//")[0] for line in path.read_text().splitlines())
        assert not re.search(r"\bvnetEnabled\s*\?", code), path
    assert (tmp_path / "infra" / "abbreviations.json").is_file(), "what main.bicep loads"


SKIP = re.compile(r"checkov:skip=(?P<ids>[^:\s]*)(?::(?P<reason>.*))?")


def test_every_skip_in_the_templates_names_one_check_and_says_why():
    """Checkov's Bicep runner reads one check id per skip comment (a list is one unknown id),
    and a skip without a reason is not a reviewed exception."""
    skips = []
    for path in checks.bicep_files(checks.REPO_ROOT / "infra"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if match := SKIP.search(line):
                where = f"{path.relative_to(checks.REPO_ROOT)}:{number}"
                assert re.fullmatch(r"CKV2?_AZURE_\d+", match["ids"]), f"{where}: {line.strip()}"
                reason = (match["reason"] or "").strip()
                assert len(reason) >= 20, f"{where}: say why it is skipped"
                shape = re.match(r"(\w+) shape only:", reason)
                assert shape is None or shape[1] in checks.SHAPES, where
                skips.append(where)
    assert len(skips) >= 10


def test_the_scan_says_how_to_install_checkov_when_it_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(scan, "CHECKOV", Path("/nonexistent/checkov"))
    assert scan.main() == 2
    assert "run scripts/bootstrap" in capsys.readouterr().err
