"""The proxy the environment names for a URL, read once per endpoint.

aiohttp reads ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` itself with ``trust_env=True``, but on
every request, scanning the environment twice; the app's endpoints are known when its clients
are built (the storage account, the three services), so each is looked up once then.
"""

from __future__ import annotations

import urllib.request
from urllib.parse import urlsplit


def env_proxy(url: str) -> str | None:
    """The proxy for ``url``: ``HTTPS_PROXY`` or ``HTTP_PROXY`` by its scheme, else
    ``ALL_PROXY`` (any case, as urllib and aiohttp read them), unless ``NO_PROXY`` exempts its
    host; None when there is none."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    return proxy
