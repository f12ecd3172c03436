"""osfleet's own asset URLs answered inside the process that runs OSWorld's harness.

osfleet's task bundles (the shipped ``osworld`` suite, and bundles a user adds) name their files under
``https://assets.osfleet.invalid/``: a host in the ``.invalid`` top-level domain, which never resolves (RFC 6761),
so those URLs are names for files, not places on the web. osfleet's own runner resolves them in the host's asset
store. OSWorld's set-up controller instead downloads a ``download`` step's URL with ``requests`` on the machine
running the benchmark and uploads the bytes into the VM; for those names it would fail (no such host).

``install()`` (called by ``register()``) mounts a ``requests`` transport adapter for that one host on every
``requests.Session`` the process makes (``requests.get`` makes one per call): it answers from the bundles shipped
with osfleet (``osfleet/tasks/suites/*/assets/manifest.json``) and from this machine's asset store
(``$OSFLEET_HOME/assets``, filled by ``osfleet tasks assets add|add-bundle|fetch``). A URL neither holds is a 404,
so OSWorld's set-up fails naming it. No other URL is touched: real downloads go to the network as before.
"""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from osfleet.tasks.assets import BUNDLE_MANIFEST, AssetError, AssetStore, MissingAssetError

if TYPE_CHECKING:
    from requests.adapters import BaseAdapter

ASSET_HOST = "assets.osfleet.invalid"
PREFIXES = (f"https://{ASSET_HOST}/", f"http://{ASSET_HOST}/")
SUITES = Path(__file__).resolve().parent.parent / "tasks" / "suites"
MARK = "__osfleet_assets__"


@functools.lru_cache(maxsize=1)
def shipped_assets() -> dict[str, Path]:
    """URL -> file of every bundle shipped with osfleet (read once: they are part of the installed package)."""
    found: dict[str, Path] = {}
    for manifest in sorted(SUITES.glob(f"*/{BUNDLE_MANIFEST}")):
        try:
            files = json.loads(manifest.read_text()).get("files", [])
        except (OSError, ValueError, AttributeError):
            continue
        for entry in files if isinstance(files, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("url"), str) and isinstance(entry.get("file"), str):
                path = (manifest.parent / entry["file"]).resolve()
                if path.is_relative_to(manifest.parent.resolve()) and path.is_file():
                    found[entry["url"]] = path
    return found


def asset_file(url: str, store: AssetStore | None = None) -> Path | None:
    """The file an osfleet asset URL names here, or None."""
    shipped = shipped_assets().get(url)
    if shipped is not None:
        return shipped
    try:
        path = (store or AssetStore.from_settings()).path(url)
    except (MissingAssetError, AssetError, OSError):
        return None
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


def _adapter_class() -> type[BaseAdapter]:
    from requests.adapters import BaseAdapter
    from requests.models import PreparedRequest, Response
    from requests.structures import CaseInsensitiveDict

    class AssetAdapter(BaseAdapter):
        """Answers GET/HEAD for osfleet's asset host from local files (the module's docstring)."""

        def send(
            self,
            request: PreparedRequest,
            stream: bool = False,
            timeout: Any = None,
            verify: bool | str = True,
            cert: Any = None,
            proxies: Any = None,
        ) -> Response:
            response = Response()
            url = request.url or ""
            response.request, response.url = request, url
            path = asset_file(url.split("?", 1)[0]) if urlsplit(url).hostname == ASSET_HOST else None
            if request.method not in ("GET", "HEAD") or path is None:
                response.status_code = 405 if path is not None else 404
                response.reason = "Method Not Allowed" if path is not None else "Not Found"
                body = f"{url}: not an osfleet asset on this machine".encode() if path is None else b""
                response.raw = io.BytesIO(body)
                response.headers = CaseInsensitiveDict({"Content-Length": str(len(body))})
                return response
            response.status_code, response.reason = 200, "OK"
            size = path.stat().st_size
            response.headers = CaseInsensitiveDict(
                {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
            )
            response.raw = io.BytesIO(b"") if request.method == "HEAD" else _FileBody(path)
            return response

        def close(self) -> None:
            pass

    return AssetAdapter


def install() -> None:
    """Serve osfleet's asset URLs in every ``requests.Session`` of this process (idempotent)."""
    import requests

    init = requests.Session.__init__
    if getattr(init, MARK, False):
        return
    adapter = _adapter_class()()

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for prefix in PREFIXES:
            self.mount(prefix, adapter)

    setattr(__init__, MARK, True)
    requests.Session.__init__ = __init__  # type: ignore[method-assign]


def uninstall() -> None:
    """Put ``requests.Session`` back as it was."""
    import requests

    init = requests.Session.__init__
    if getattr(init, MARK, False):
        requests.Session.__init__ = init.__wrapped__  # type: ignore[attr-defined,method-assign]
