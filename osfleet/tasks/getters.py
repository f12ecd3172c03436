"""OSWorld getters, run from the host: each turns a ``result``/``expected`` spec into a value for a metric.

- ``vm_file``: the guest file, read through the guest agent into a local folder (a ``Path``; ``None`` when
  the file does not exist: the agent did not make it, which scores 0 rather than failing);
- ``cloud_file``: the host's asset store copy of the URL (never a download);
- ``vm_command_line``: the command's standard output in the guest (as the desktop user);
- ``rule``: the ``rules`` object itself; ``constant``: its ``value``;
- ``vm_window_size``: ``{"width", "height"}`` of the first visible window of ``app_class_name`` (xdotool),
  ``None`` when there is none.
Failing to reach the guest raises (an infrastructure failure, never a score).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from osfleet.errors import OsfleetError
from osfleet.replicas.actions import MAX_READ_BYTES
from osfleet.tasks.assets import AssetStore


class GuestAccess(Protocol):
    """What a getter needs of a replica host (``ReplicaHost`` has it; tests give a fake)."""

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]: ...

    def read_file(self, replica_id: str, path: str, limit: int) -> bytes: ...


def _command(cmd: Any) -> str:
    return shlex.join(cmd) if isinstance(cmd, list) else str(cmd)


def _vm_file(host: GuestAccess, rid: str, spec: dict[str, Any], workdir: Path, timeout: float) -> Path | None:
    path = str(spec["path"])
    q = shlex.quote(path)
    out = host.shell(rid, f"test -f {q} && echo present || echo absent", timeout, True)
    if out["stdout"].strip() != "present":
        return None
    name = PurePosixPath(str(spec.get("dest") or path)).name or "file"
    local = workdir / f"{len(list(workdir.iterdir()))}-{name}"
    local.write_bytes(host.read_file(rid, path, MAX_READ_BYTES))
    return local


def _named(blob: Path, spec: dict[str, Any], workdir: Path) -> Path:
    """The store's blob under the name the task gives it (``dest``, else the URL's last part): metrics and the
    libraries under them go by file names."""
    name = PurePosixPath(str(spec.get("dest") or str(spec["path"]).split("?")[0])).name or "file"
    link = workdir / f"{len(list(workdir.iterdir()))}-{name}"
    link.symlink_to(blob)
    return link


def _window_size(host: GuestAccess, rid: str, spec: dict[str, Any], timeout: float) -> dict[str, int] | None:
    cls = shlex.quote(str(spec["app_class_name"]))
    out = host.shell(
        rid,
        f"w=$(xdotool search --onlyvisible --class {cls} 2>/dev/null | head -n 1); "
        '[ -n "$w" ] && xdotool getwindowgeometry --shell "$w"',
        timeout,
    )
    size = dict(re.findall(r"^(WIDTH|HEIGHT)=(\d+)$", out["stdout"], re.MULTILINE))
    if "WIDTH" not in size or "HEIGHT" not in size:
        return None
    return {"width": int(size["WIDTH"]), "height": int(size["HEIGHT"])}


def get(host: GuestAccess, rid: str, spec: dict[str, Any], workdir: Path, store: AssetStore, timeout: float) -> Any:
    """The value of one getter ``spec`` (a dumped OSWorld result/expected object)."""
    kind = spec.get("type")
    if kind == "vm_file":
        return _vm_file(host, rid, spec, workdir, timeout)
    if kind == "cloud_file":
        return _named(store.path(str(spec["path"])), spec, workdir)
    if kind == "vm_command_line":
        return host.shell(rid, _command(spec["command"]), timeout)["stdout"]
    if kind == "rule":
        return spec.get("rules", {})
    if kind == "constant":
        return spec.get("value")
    if kind == "vm_window_size":
        return _window_size(host, rid, spec, timeout)
    raise OsfleetError(f"unsupported OSWorld getter {kind!r}")
