"""The jail finds its Python wherever the checkout is: a clone under ``/tmp`` (``git clone ... /tmp/ci``) kept its
virtualenv at a path that both bwrap's ``/tmp`` and each evaluation's private ``/tmp`` used to hide, so every
metric scored 0 ("No such file or directory: '/tmp/ci/.venv/bin/python'").

The virtualenv is bound at ``/tmp/<x>/.venv`` in a private mount namespace of the test's own (nothing is mounted
in the host's), and a sandbox started from there runs a test suite that itself starts the interpreter.
"""

from __future__ import annotations

import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import VENV_BIN

pytestmark = pytest.mark.system

PROGRAM = textwrap.dedent(
    """
    import sys, tempfile
    from pathlib import Path
    from osfleet.tasks.jail.sandbox import Limits, Sandbox
    folder = Path(tempfile.mkdtemp())
    (folder / "suite.py").write_text(
        "import subprocess, sys\\n"
        "def test():\\n"
        "    out = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True)\\n"
        "    return 1.0 if out.stdout.strip() == '42' else 0.0\\n"
    )
    (folder / "answer.py").write_text("x = 1\\n")
    box = Sandbox(Limits(wall_seconds=40))
    box.start()
    try:
        print(sys.prefix, box.run("check_python_file_by_test_suite", folder / "answer.py", folder / "suite.py",
                                  {"test_function_name": "test"}))
    finally:
        box.close()
    """
)


def test_a_virtualenv_under_tmp_runs_metrics(tmp_path: Path) -> None:
    venv = VENV_BIN.parent.resolve()
    if venv.is_relative_to("/tmp"):
        pytest.skip("this checkout's virtualenv is under /tmp already: every jail test covers it")
    place = Path("/tmp") / f"osfleet-jail-venv-{tmp_path.name}"
    script = (
        f"mkdir -p {place}/.venv && mount --bind {venv} {place}/.venv && "
        f"exec {place}/.venv/bin/python -c {shlex.quote(PROGRAM)}"
    )
    try:
        out = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(place)], check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == f"{place}/.venv", out.stdout  # the interpreter ran from under /tmp
    assert "(1.0, 'the test suite gave 1.0')" in out.stdout, out.stdout
