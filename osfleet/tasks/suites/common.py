"""What every task module of the ``osworld`` suite shares: the bundle's URL base, the guest's home, and the
small builders of OSWorld-format set-up steps, evaluators and oracle steps."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

BUNDLE = Path(__file__).parent / "osworld"
URL_BASE = "https://assets.osfleet.invalid/osworld-suite/"  # never fetched: resolved in the asset store
HOME = "/home/user"
FIXED_TIME = "2024-01-01T00:00:00"
ORACLE_TIMEOUT_SECONDS = 120.0


def xlsx(path: Path, rows: list[list[Any]], title: str = "Sheet1", formats: dict[str, str] | None = None) -> None:
    import datetime as dt

    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    assert ws is not None
    ws.title = title
    for row in rows:
        ws.append(row)
    for cell, fmt in (formats or {}).items():
        ws[cell].number_format = fmt
    wb.properties.created = wb.properties.modified = dt.datetime.fromisoformat(FIXED_TIME)
    wb.save(path)


def docx(path: Path, paragraphs: list[str]) -> None:
    import datetime as dt

    import docx

    d = docx.Document()
    for text in paragraphs:
        d.add_paragraph(text)
    d.core_properties.created = d.core_properties.modified = dt.datetime.fromisoformat(FIXED_TIME)
    d.save(str(path))


def python(script: str) -> dict[str, Any]:
    """A CLI oracle step: a python3 script in the guest, as the desktop user."""
    # python3 importing openpyxl or python-docx took 20-26 s in a TCG guest on a busy host: the default 30 s
    # command timeout left too little room.
    command = f"python3 - <<'OSFLEET_ORACLE'\n{script.strip()}\nOSFLEET_ORACLE"
    return {"type": "cli_command", "command": command, "timeout": ORACLE_TIMEOUT_SECONDS}


def shell(command: str, timeout: float | None = None) -> dict[str, Any]:
    """A CLI oracle step: ``command`` with sh in the guest, as the desktop user."""
    step: dict[str, Any] = {"type": "cli_command", "command": command}
    if timeout is not None:
        step["timeout"] = timeout
    return step


def download(name: str, guest_path: str, *more: tuple[str, str]) -> dict[str, Any]:
    """An OSWorld ``download`` step of the bundle's asset ``name`` to ``guest_path`` (and more such pairs)."""
    files = [{"url": URL_BASE + n, "path": p} for n, p in ((name, guest_path), *more)]
    return {"type": "download", "parameters": {"files": files}}


def table(doc: str, gold: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "func": "compare_table",
        "result": {"type": "vm_file", "path": doc, "dest": Path(doc).name},
        "expected": {"type": "cloud_file", "path": URL_BASE + gold, "dest": gold},
        "options": {"rules": rules},
    }


SHEET_DATA = [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]
SHEET_PRINT = [{"type": "sheet_print", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]


def task(
    task_id: str,
    app: str | list[str],
    instruction: str,
    config: list[dict[str, Any]],
    evaluator: dict[str, Any],
    oracle: list[dict[str, Any]],
) -> dict[str, Any]:
    """One task; ``app`` is its application, or the applications of a multi-app task (snapshot multi_apps)."""
    apps = [app] if isinstance(app, str) else app
    return {
        "id": task_id,
        "snapshot": apps[0] if len(apps) == 1 else "multi_apps",
        "instruction": instruction,
        "source": "osfleet",
        "config": config,
        "trajectory": "trajectories/",
        "related_apps": apps,
        "evaluator": evaluator,
        "osfleet_oracle": oracle,
    }


def cloud(name: str) -> dict[str, Any]:
    """The bundle's copy of asset ``name`` as an OSWorld ``cloud_file`` getter."""
    return {"type": "cloud_file", "path": URL_BASE + name, "dest": name}


def vm_file(path: str) -> dict[str, Any]:
    return {"type": "vm_file", "path": path, "dest": Path(path).name}


def rule(rules: Any) -> dict[str, Any]:
    return {"type": "rule", "rules": rules}


def run(command: str) -> dict[str, Any]:
    """An OSWorld ``execute`` set-up step running ``command`` with bash (as OSWorld's own steps do)."""
    return {"type": "execute", "parameters": {"command": ["/bin/bash", "-c", command]}}


def launch(command: str) -> dict[str, Any]:
    return {"type": "launch", "parameters": {"command": shlex.split(command)}}


def chrome_with_devtools() -> list[dict[str, Any]]:
    """Chrome started as OSWorld's own browser tasks start it, DevTools on 1337: osfleet's runner and OSWorld's
    harness (through the provider's forward of that port) both find it there."""
    return [launch("google-chrome --remote-debugging-port=1337")]
