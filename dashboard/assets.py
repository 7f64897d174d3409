"""The dashboard's files: its own (``static/``) and the front-end libraries it vendors
(``static/vendor/``, copied from node_modules by :mod:`dashboard.vendor`), served from memory.

Only files that exist in those two folders, with a known extension, are served, looked up by
their bare name (a route parameter is one path segment, so there is no path to traverse). Each
is read once (again if it changed on disk), with a strong ETag (a hash of its bytes) and a
gzip copy for clients that accept it. Pages (``*.html``) are templates: each
``%%static:NAME%%`` or ``%%vendor:NAME%%`` becomes that asset's URL, versioned by its ETag and
carrying the caller's function key (``code``), since a browser sends no header with a
``<script src>``; the page's own scripts send the key as ``x-functions-key``.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote

STATIC_DIR: Final = Path(__file__).resolve().with_name("static")
VENDOR_DIR: Final = STATIC_DIR / "vendor"
URL_PREFIX: Final = "/api/dashboard"
"""Where the dashboard is served: the Functions host's default route prefix, ``api``."""

CONTENT_TYPES: Final = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
    ".LICENSE": "text/plain; charset=utf-8",
    ".NOTICE": "text/plain; charset=utf-8",
}
COMPRESSIBLE: Final = (".js", ".css", ".html", ".svg", ".txt")
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ASSET_REF: Final = re.compile(r"%%(static|vendor):([A-Za-z0-9._-]+)%%")
FUNCTION_KEY: Final = re.compile(r"[A-Za-z0-9+/=_-]{1,256}")
"""What a function key looks like; any other ``code`` is not repeated into a page."""


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes | None
    etag: str
    content_type: str
    mtime_ns: int


class MissingAsset(LookupError):
    pass


class Assets:
    """The files of one folder, by name."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cache: dict[str, Asset] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Asset:
        """The file ``name`` of this folder, or :class:`MissingAsset`."""
        content_type = next((t for s, t in CONTENT_TYPES.items() if name.endswith(s)), None)
        if not _NAME.fullmatch(name) or content_type is None:
            raise MissingAsset(name)
        path = self.folder / name
        try:
            stat = path.stat()
        except OSError:
            raise MissingAsset(name) from None
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and cached.mtime_ns == stat.st_mtime_ns:
                return cached
        body = path.read_bytes()
        compress = name.endswith(COMPRESSIBLE) and len(body) > 1024
        asset = Asset(
            body=body,
            gzipped=gzip.compress(body, compresslevel=6, mtime=0) if compress else None,
            etag='"' + hashlib.sha256(body).hexdigest()[:32] + '"',
            content_type=content_type,
            mtime_ns=stat.st_mtime_ns,
        )
        with self._lock:
            self._cache[name] = asset
        return asset


OWN: Final = Assets(STATIC_DIR)
VENDOR: Final = Assets(VENDOR_DIR)


def asset_url(kind: str, name: str, key: str | None) -> str:
    """The URL of asset ``name`` (``kind``: static or vendor), versioned, with ``key``."""
    asset = (OWN if kind == "static" else VENDOR).get(name)
    url = f"{URL_PREFIX}/{kind}/{name}?v={asset.etag.strip(chr(34))[:12]}"
    if key:
        url += f"&code={quote(key, safe='')}"
    return url


def render_page(name: str, key: str | None) -> bytes:
    """Page ``name`` of static/, each ``%%static:NAME%%`` or ``%%vendor:NAME%%`` in it turned
    into that asset's URL (HTML-escaped)."""
    template = OWN.get(name).body.decode("utf-8")
    usable = key if key is not None and FUNCTION_KEY.fullmatch(key) else None

    def fill(match: re.Match[str]) -> str:
        return html.escape(asset_url(match.group(1), match.group(2), usable), quote=True)

    return _ASSET_REF.sub(fill, template).encode("utf-8")
