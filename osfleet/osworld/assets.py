"""OSWorld's downloads answered from osfleet's assets, inside the process that runs OSWorld's harness.

OSWorld's set-up controller downloads a ``download`` step's URL with ``requests`` on the machine running the
benchmark (then uploads the bytes into the VM), and its ``cloud_file`` getter downloads expected files the same way.
osfleet keeps such files offline: the host's asset store (``$OSFLEET_HOME/assets``, filled by ``osfleet tasks
assets add|add-bundle|fetch``) maps each URL to its bytes, and osfleet's own bundles (the shipped ``osworld``
suite) name theirs under ``https://assets.osfleet.invalid/``, a host in the ``.invalid`` top-level domain that never
resolves (RFC 6761).

``install()`` (called by ``register()``) mounts a ``requests`` transport adapter on every ``requests.Session`` the
process makes (``requests.get`` makes one per call): a GET of a URL the shipped bundles or this machine's asset
store hold is answered from the file, so OSWorld's set-up and getters stay offline for every task whose assets are
on hand; a URL of osfleet's asset host that neither holds is a 404 naming it; any other URL goes to the network as
before (the adapter the session had). This is what filling OSWorld's cache folder ahead of time would do, without
depending on its file naming, for downloads and getters alike.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from osfleet.tasks.assets import AssetError, AssetStore, shipped_assets

if TYPE_CHECKING:
    from requests.adapters import BaseAdapter

ASSET_HOST = "assets.osfleet.invalid"
PREFIXES = ("https://", "http://")
MARK = "__osfleet_assets__"


_index: tuple[Path, float, dict[str, str]] | None = None  # the store's index as last read: (file, mtime, map)


def _store_index(store: AssetStore) -> dict[str, str]:
    """The asset store's URL -> sha256 map, read again only when its file changed (every request asks)."""
    global _index
    try:
        mtime = store.index_path.stat().st_mtime
    except OSError:
        return {}
    if _index is None or _index[0] != store.index_path or _index[1] != mtime:
        try:
            _index = (store.index_path, mtime, store.index())
        except AssetError:
            return {}
    return _index[2]


def asset_file(url: str, store: AssetStore | None = None) -> Path | None:
    """The file that answers ``url`` here (a shipped bundle's, or the asset store's), or None."""
    shipped = shipped_assets().get(url)
    if shipped is not None:
        return shipped
    store = store or AssetStore.from_settings()
    digest = _store_index(store).get(url)
    if digest is None:
        return None
    path = store.blob(digest)
    return path if path.is_file() else None


class _FileBody(io.RawIOBase):
    """A response body read from a file, closed when read to its end (``requests`` does not close a body it has
    read whole, and a caller of ``requests.get(...).content`` never does)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._file.closed:
            return 0
        n = self._file.readinto(buffer)
        if not n:
            self._file.close()
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def _adapter_class() -> Callable[[BaseAdapter], BaseAdapter]:
    from requests.adapters import BaseAdapter
    from requests.models import PreparedRequest, Response
    from requests.structures import CaseInsensitiveDict

    class AssetAdapter(BaseAdapter):
        """GETs of URLs with a file here answered from it; the rest sent on by ``network`` (the module's
        docstring)."""

        def __init__(self, network: BaseAdapter) -> None:
            super().__init__()
            self.network = network

        def send(
            self,
            request: PreparedRequest,
            stream: bool = False,
            timeout: Any = None,
            verify: bool | str = True,
            cert: Any = None,
            proxies: Any = None,
        ) -> Response:
            url = request.url or ""
            ours = urlsplit(url).hostname == ASSET_HOST
            path = asset_file(url) if request.method in ("GET", "HEAD") else None
            if path is None and not ours:
                return self.network.send(request, stream, timeout, verify, cert, proxies)
            response = Response()
            response.request, response.url = request, url
            if path is None:
                response.status_code, response.reason = 404, "Not Found"
                body = f"{url}: not an osfleet asset on this machine".encode()
                response.raw = io.BytesIO(body)
                response.headers = CaseInsensitiveDict({"Content-Length": str(len(body))})
                return response
            response.status_code, response.reason = 200, "OK"
            response.headers = CaseInsensitiveDict(
                {"Content-Length": str(path.stat().st_size), "Content-Type": "application/octet-stream"}
            )
            response.raw = io.BytesIO(b"") if request.method == "HEAD" else _FileBody(path)
            return response

        def close(self) -> None:
            self.network.close()

    return AssetAdapter


def install() -> None:
    """Answer GETs of the URLs osfleet holds files for in every ``requests.Session`` of this process
    (idempotent)."""
    import requests

    init = requests.Session.__init__
    if getattr(init, MARK, False):
        return
    adapter_class = _adapter_class()

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for prefix in PREFIXES:
            self.mount(prefix, adapter_class(self.get_adapter(prefix)))

    setattr(__init__, MARK, True)
    requests.Session.__init__ = __init__  # type: ignore[method-assign]


def uninstall() -> None:
    """Put ``requests.Session`` back as it was."""
    import requests

    init = requests.Session.__init__
    if getattr(init, MARK, False):
        requests.Session.__init__ = init.__wrapped__  # type: ignore[attr-defined,method-assign]
