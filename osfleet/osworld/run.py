"""``python -m osfleet.osworld.run SCRIPT [ARGS...]``: OSWorld's runners as published, with ``--provider_name osfleet``.

OSWorld's ``scripts/python/run_multienv.py`` (and the runners copied from it) build their ``DesktopEnv`` from
``--provider_name``, whose argparse ``choices`` list only desktop-env's own providers. This command calls
``register()`` (settings from the environment: ``OSFLEET_URL``, ``OSFLEET_TOKEN`` or ``OSFLEET_TOKEN_FILE``), lets
``--provider_name`` also take ``osfleet`` in whatever parser the script makes, then runs the script as ``__main__``
with the remaining arguments, unchanged otherwise. Its worker processes inherit the registration where they are
forked (Linux's default for ``multiprocessing``); a runner that starts them with ``spawn`` must call ``register()``
in each worker itself.

    python -m osfleet.osworld.run scripts/python/run_multienv.py --provider_name osfleet --num_envs 4 ...
"""

from __future__ import annotations

import argparse
import functools
import runpy
import sys
from pathlib import Path
from typing import Any

from osfleet.osworld.registration import PROVIDER_NAME, register

OPTION = "--provider_name"
USAGE = "usage: python -m osfleet.osworld.run SCRIPT [ARGS...]  (an OSWorld runner, e.g. run_multienv.py)"


def allow_provider_choice() -> None:
    """Every ``--provider_name`` argument with ``choices`` made from now on also accepts ``osfleet``."""
    add = argparse.ArgumentParser.add_argument
    if getattr(add, "__osfleet_osworld__", False):
        return

    @functools.wraps(add)
    def add_argument(self: Any, *names: Any, **kwargs: Any) -> Any:
        choices = kwargs.get("choices")
        if OPTION in names and choices is not None and PROVIDER_NAME not in choices:
            kwargs["choices"] = [*choices, PROVIDER_NAME]
        return add(self, *names, **kwargs)

    add_argument.__osfleet_osworld__ = True  # type: ignore[attr-defined]
    argparse.ArgumentParser.add_argument = add_argument  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    script = Path(args[0])
    if not script.is_file():
        print(f"osfleet.osworld.run: error: no such script: {script}", file=sys.stderr)
        return 2
    try:
        register()
    except ImportError as exc:
        print(f"osfleet.osworld.run: error: {exc}", file=sys.stderr)
        return 2
    allow_provider_choice()
    sys.argv = [str(script), *args[1:]]
    sys.path.insert(0, str(script.resolve().parent))  # as ``python SCRIPT`` would
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
