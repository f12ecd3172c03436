"""Suite tasks on the system (files, permissions, archives, sudo with OSWorld's password) and tasks that span
applications (a spreadsheet's number into a text file, a web page's title into a note)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from osfleet.tasks.suites.common import (
    HOME,
    chrome_with_devtools,
    cloud,
    download,
    python,
    rule,
    run,
    shell,
    task,
    vm_file,
    xlsx,
)


def _command(command: str, expected: str) -> dict[str, Any]:
    """``exact_match`` of a command's output (as OSWorld compares it: the whole output, its last newline too)."""
    return {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": command, "shell": True},
        "expected": rule({"expected": expected + "\n"}),
    }


def _os_tasks(assets: Path) -> list[dict[str, Any]]:
    out = []
    out.append(
        task(
            "os-archive-folder",
            "os",
            "Pack the folder ~/docs (with the folder itself) into a gzip-compressed tar archive ~/docs.tar.gz.",
            [run(f"mkdir -p {HOME}/docs && echo one > {HOME}/docs/a.txt && echo two > {HOME}/docs/b.txt")],
            _command(
                f"tar -tzf {HOME}/docs.tar.gz 2>/dev/null | sed 's#/$##' | sort | paste -sd ' '",
                "docs docs/a.txt docs/b.txt",
            ),
            [shell("cd ~ && tar -czf docs.tar.gz docs")],
        )
    )
    out.append(
        task(
            "os-owner-only-script",
            "os",
            "Make ~/run.sh readable, writable and executable by its owner only (no rights for anyone else).",
            [run(f"printf '#!/bin/sh\\necho hi\\n' > {HOME}/run.sh && chmod 644 {HOME}/run.sh")],
            _command(f"stat -c %a {HOME}/run.sh", "700"),
            [shell("chmod 700 ~/run.sh")],
        )
    )
    out.append(
        task(
            "os-shared-folder-sudo",
            "os",
            "Create the folder /srv/share owned by user (mode 755). You will need sudo; the password is 'password'.",
            [],
            _command("stat -c %U:%a /srv/share 2>/dev/null", "user:755"),
            [shell("echo password | sudo -S install -d -o user -g user -m 755 /srv/share")],
        )
    )
    out.append(
        task(
            "os-move-big-logs",
            "os",
            "Move every .log file in ~/logs that is larger than 1 KB into a new folder ~/logs/big.",
            [
                run(
                    f"mkdir -p {HOME}/logs && head -c 4000 /dev/zero > {HOME}/logs/app.log && "
                    f"head -c 3000 /dev/zero > {HOME}/logs/db.log && echo ok > {HOME}/logs/cron.log && "
                    f"head -c 5000 /dev/zero > {HOME}/logs/data.bin"
                )
            ],
            _command(
                f"cd {HOME}/logs 2>/dev/null && ls big 2>/dev/null | paste -sd ' ' && ls | paste -sd ' '",
                "app.log db.log\nbig cron.log data.bin",
            ),
            [
                shell(
                    "mkdir -p ~/logs/big && find ~/logs -maxdepth 1 -name '*.log' -size +1k -exec mv {} ~/logs/big/ ';'"
                )
            ],
        )
    )
    out.append(
        task(
            "os-current-symlink",
            "os",
            "Make ~/current a symbolic link to the folder ~/releases/v2.",
            [run(f"mkdir -p {HOME}/releases/v1 {HOME}/releases/v2")],
            _command(f"readlink {HOME}/current", f"{HOME}/releases/v2"),
            [shell("ln -sfn ~/releases/v2 ~/current")],
        )
    )
    (assets / "errors-gold.txt").write_text("3\n")
    log = "\n".join(["INFO start", "ERROR disk", "INFO ok", "ERROR net", "WARN slow", "ERROR disk"]) + "\n"
    (assets / "service.log").write_text(log)
    out.append(
        task(
            "os-count-errors",
            "os",
            "Write the number of lines of ~/service.log that contain ERROR into ~/errors.txt (just the number).",
            [download("service.log", f"{HOME}/service.log")],
            {
                "func": "compare_text_file",
                "result": vm_file(f"{HOME}/errors.txt"),
                "expected": cloud("errors-gold.txt"),
            },
            [shell("grep -c ERROR ~/service.log > ~/errors.txt")],
        )
    )
    return out


def _multi_tasks(assets: Path) -> list[dict[str, Any]]:
    out = []
    xlsx(assets / "orders.xlsx", [["Order", "Amount"], ["A-1", 120], ["A-2", 80], ["A-3", 45]])
    (assets / "orders-total-gold.txt").write_text("245\n")
    doc, note = f"{HOME}/Desktop/orders.xlsx", f"{HOME}/Desktop/total.txt"
    out.append(
        task(
            "multi-sum-to-note",
            ["libreoffice_calc", "text_editor"],
            "Add up the Amount column of ~/Desktop/orders.xlsx and write the total (just the number) into "
            "~/Desktop/total.txt.",
            [download("orders.xlsx", doc)],
            {"func": "compare_text_file", "result": vm_file(note), "expected": cloud("orders-total-gold.txt")},
            [
                python(f"""
import openpyxl
ws = openpyxl.load_workbook({doc!r}).active
open({note!r}, "w").write(str(sum(r[1].value for r in ws.iter_rows(min_row=2))) + "\\n")""")
            ],
        )
    )
    (assets / "article.html").write_text(
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>Solar boats cross the lake</title></head>"
        "<body><h1>Solar boats cross the lake</h1><p>All three boats arrived.</p></body></html>\n"
    )
    (assets / "article-title-gold.txt").write_text("Solar boats cross the lake\n")
    page, note = f"{HOME}/site/article.html", f"{HOME}/Documents/title.txt"
    out.append(
        task(
            "multi-page-title-to-note",
            ["chrome", "text_editor"],
            "Chrome shows an article. Write its title, exactly as shown on the tab, into ~/Documents/title.txt.",
            [
                download("article.html", page),
                *chrome_with_devtools(),
                {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [f"file://{page}"]}},
            ],
            {"func": "compare_text_file", "result": vm_file(note), "expected": cloud("article-title-gold.txt")},
            [shell(f"mkdir -p ~/Documents && sed -n 's#.*<title>\\(.*\\)</title>.*#\\1#p' {page} > {note}")],
        )
    )
    return out


def tasks(assets: Path) -> list[dict[str, Any]]:
    return _os_tasks(assets) + _multi_tasks(assets)
