"""Copy the dashboard's front-end libraries from node_modules into ``dashboard/static/vendor/``.

The libraries are npm packages pinned exactly in package.json and package-lock.json (installed
by ``npm ci``, which scripts/bootstrap runs). node_modules is not deployed (``.funcignore``), so
the files the page loads are copied into the dashboard package, which is: the Azure deployment
package then holds them, and nothing is fetched from a CDN at run time. ``VERSIONS.json`` in
that folder records, per file, the package, its version and the file's SHA-256.

    python -m dashboard.vendor          # after changing a version: npm install --save-exact ...
    python -m dashboard.vendor --check  # the copies are exactly the locked packages' files

``--check`` (run by the tests) fails when a copy differs from node_modules, when a package's
installed version is not the one package-lock.json pins, or when a file is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from dashboard.assets import VENDOR_DIR

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
FILES: Final = {
    # served name -> (npm package, path inside it)
    "uPlot.iife.min.js": ("uplot", "dist/uPlot.iife.min.js"),
    "uPlot.min.css": ("uplot", "dist/uPlot.min.css"),
    "uplot.LICENSE": ("uplot", "LICENSE"),
    "swagger-ui-bundle.js": ("swagger-ui-dist", "swagger-ui-bundle.js"),
    "swagger-ui-bundle.js.LICENSE.txt": ("swagger-ui-dist", "swagger-ui-bundle.js.LICENSE.txt"),
    "swagger-ui.css": ("swagger-ui-dist", "swagger-ui.css"),
    "swagger-ui-dist.LICENSE": ("swagger-ui-dist", "LICENSE"),
    "swagger-ui-dist.NOTICE": ("swagger-ui-dist", "NOTICE"),
}
MANIFEST: Final = "VERSIONS.json"


def locked_versions(root: Path = REPO_ROOT) -> dict[str, str]:
    """Package -> the version package-lock.json pins, for the vendored packages."""
    lock = json.loads((root / "package-lock.json").read_text(encoding="utf-8"))
    packages = lock.get("packages") or {}
    return {
        name: str((packages.get(f"node_modules/{name}") or {}).get("version"))
        for name in {package for package, _ in FILES.values()}
    }


def installed_version(package: str, root: Path = REPO_ROOT) -> str | None:
    manifest = root / "node_modules" / package / "package.json"
    if not manifest.is_file():
        return None
    return str(json.loads(manifest.read_text(encoding="utf-8")).get("version"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy(root: Path = REPO_ROOT, target: Path = VENDOR_DIR) -> dict[str, dict[str, str]]:
    """Copy every file of :data:`FILES` and write the manifest; returns the manifest."""
    locked = locked_versions(root)
    problems = [
        f"node_modules/{package} is {installed_version(package, root)}, package-lock.json "
        f"pins {version}: run npm ci"
        for package, version in locked.items()
        if installed_version(package, root) != version
    ]
    if problems:
        raise SystemExit("\n".join(problems))
    target.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, dict[str, str]] = {}
    for name, (package, inner) in sorted(FILES.items()):
        source = root / "node_modules" / package / inner
        shutil.copyfile(source, target / name)
        manifest[name] = {
            "package": package,
            "version": locked[package],
            "source": f"node_modules/{package}/{inner}",
            "sha256": _sha256(source),
        }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def check(root: Path = REPO_ROOT, target: Path = VENDOR_DIR) -> list[str]:
    """What is wrong with the vendored copies (empty: they are the locked packages' files).
    Without node_modules, the copies are checked against the manifest and the lock only."""
    problems: list[str] = []
    locked = locked_versions(root)
    try:
        manifest = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"{target / MANIFEST} is unreadable ({exc}): run python -m dashboard.vendor"]
    for name, (package, inner) in sorted(FILES.items()):
        copied = target / name
        entry = manifest.get(name) or {}
        if not copied.is_file():
            problems.append(f"{name} is missing: run python -m dashboard.vendor")
            continue
        if entry.get("version") != locked[package]:
            problems.append(
                f"{name} is from {package} {entry.get('version')}, package-lock.json pins "
                f"{locked[package]}: run python -m dashboard.vendor"
            )
        if entry.get("sha256") != _sha256(copied):
            problems.append(
                f"{name} was changed after it was copied: run python -m dashboard.vendor"
            )
        source = root / "node_modules" / package / inner
        installed = source.is_file() and installed_version(package, root) == locked[package]
        if installed and _sha256(source) != _sha256(copied):
            problems.append(f"{name} differs from {source}: run python -m dashboard.vendor")
    extra = {p.name for p in target.iterdir() if p.is_file()} - set(FILES) - {MANIFEST}
    problems += [f"{name} is not a vendored file (FILES)" for name in sorted(extra)]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboard.vendor", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check the copies")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for problem in problems:
            print(f"vendor: {problem}", file=sys.stderr)
        return 1 if problems else 0
    manifest = copy()
    for name, entry in manifest.items():
        print(f"vendor: {name} <- {entry['source']} ({entry['package']} {entry['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
