"""OSWorld's own metric functions, loaded one module at a time, scoring requests read from stdin.

Runs under the reference virtualenv (``scripts/setup-osworld-reference``), never in osfleet's: OSWorld's
package ``__init__`` of ``metrics`` imports every module, and some modules import packages that cannot be had
here (torch through easyocr, librosa, PyMuPDF). So ``desktop_env``, ``desktop_env.evaluators`` and
``desktop_env.evaluators.metrics`` are registered as empty packages whose ``__path__`` points into the
installed wheel, and a module is imported alone; an import it cannot satisfy is replaced by a stand-in
module listed in ``STAND_INS`` with the reason, so a function that never calls it still loads, and one that
does fails loudly: every name taken from a stand-in while the function runs is recorded, and the answer is
then ``{"stand_in": [...]}``, never a score, even when OSWorld's function catches the error itself
(``chrome.compare_pdfs`` does, and would score 0 for want of PyMuPDF). Names taken while the module is
imported (``from borb.pdf import Document``) are placeholders that raise when used.

Protocol: one JSON object per line on stdin, ``{"module", "func", "args", "kwargs"}``; one JSON line back,
``{"score": float}``, ``{"error": "<type>: <message>"}`` or ``{"stand_in": [names]}``. Arguments are passed as
given (file paths, strings, dicts), the way OSWorld's ``DesktopEnv.evaluate`` calls
``metric(result, expected, **options)``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import sys
import types
from pathlib import Path

# Imports of OSWorld's metric modules that are not installed in the reference environment, and why.
STAND_INS = {
    "easyocr": "pulls in torch (GBs); only docs.compare_image_text calls it",
    "acoustid": "needs the chromaprint fpcalc binary; only vlc.compare_audios calls it",
    "fitz": "PyMuPDF is not served by this machine's package index",
    "borb": "only chrome.compare_pdf_images' helpers call it",
    "borb.pdf": "only chrome.compare_pdf_images' helpers call it",
}


# Names taken from a stand-in since the last reset (by ``main``, after the module under test is imported).
USED: list[str] = []


class _Placeholder:
    """What a stand-in hands out: using it in any way the metric would (calling it) raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> object:
        USED.append(self._name)
        raise AttributeError(f"{self._name} is a stand-in (not installed here)")

    def __getattr__(self, attr: str) -> object:
        USED.append(f"{self._name}.{attr}")
        raise AttributeError(f"{self._name}.{attr} is a stand-in (not installed here)")


class _StandIn(types.ModuleType):
    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        USED.append(f"{self.__name__}.{attr}")
        return _Placeholder(f"{self.__name__}.{attr}")


def _shims() -> None:
    """Opt-in replacements that do work (``OSWORLD_REFERENCE_SHIMS=fitz``): ``shim_<name>.py`` beside this file
    becomes module ``<name>``, so a function whose only missing piece is that import can still be checked."""
    for name in filter(None, os.environ.get("OSWORLD_REFERENCE_SHIMS", "").split(",")):
        sys.modules[name] = importlib.import_module(f"shim_{name}")


def _stand_in(name: str) -> None:
    top = name.split(".")[0]
    if name in sys.modules or (top not in sys.modules and importlib.util.find_spec(top) is not None):
        return
    module = _StandIn(name)
    module.__doc__ = f"stand-in: {STAND_INS[name]}"
    sys.modules[name] = module
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, module)


def _register_packages() -> None:
    """``desktop_env`` from the installed wheel, or from ``OSWORLD_REFERENCE_SOURCE`` (a folder holding OSWorld's
    ``desktop_env/`` of a newer commit than the newest release: metrics that exist only on its main branch)."""
    source = os.environ.get("OSWORLD_REFERENCE_SOURCE")
    spec = None if source else importlib.util.find_spec("desktop_env")
    if source:
        root = Path(source) / "desktop_env"
    elif spec is None or not spec.submodule_search_locations:
        raise SystemExit("desktop-env is not installed in this environment (scripts/setup-osworld-reference)")
    else:
        root = Path(next(iter(spec.submodule_search_locations)))
    for name, folder in (
        ("desktop_env", root),
        ("desktop_env.evaluators", root / "evaluators"),
        ("desktop_env.evaluators.metrics", root / "evaluators" / "metrics"),
    ):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package


def load(module: str) -> types.ModuleType:
    """``desktop_env.evaluators.metrics.<module>`` on its own."""
    return importlib.import_module(f"desktop_env.evaluators.metrics.{module}")


def main() -> None:
    logging.disable(logging.CRITICAL)  # OSWorld logs freely; stdout carries only answers
    _shims()
    for name in STAND_INS:
        _stand_in(name)
    _register_packages()
    out = sys.stdout
    sys.stdout = sys.stderr  # a print() inside a metric must not corrupt the protocol
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        answer: dict[str, object]
        try:
            func = getattr(load(req["module"]), req["func"])
            USED.clear()
            score = func(*req.get("args", []), **req.get("kwargs", {}))
            answer = {"score": float(score)}
        except BaseException as exc:  # noqa: BLE001  (the answer is the reference's behaviour, whatever it is)
            answer = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if USED:
            answer = {"stand_in": sorted(set(USED))}
            USED.clear()
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
