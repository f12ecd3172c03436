"""OSWorld's own metric functions, loaded one module at a time, scoring requests read from stdin.

Runs under the reference virtualenv (``scripts/setup-osworld-reference``), never in osfleet's: OSWorld's
package ``__init__`` of ``metrics`` imports every module, and some modules import packages that cannot be had
here (torch through easyocr, librosa, PyMuPDF). So ``desktop_env``, ``desktop_env.evaluators`` and
``desktop_env.evaluators.metrics`` are registered as empty packages whose ``__path__`` points into the
installed wheel, and a module is imported alone; an import it cannot satisfy is replaced by an empty stand-in
module listed in ``STAND_INS`` with the reason, so a function that never calls it still loads, and one that
does fails loudly (an ``AttributeError`` on the stand-in, reported as such, never a score).

Protocol: one JSON object per line on stdin, ``{"module", "func", "args", "kwargs"}``; one JSON line back,
``{"score": float}`` or ``{"error": "<type>: <message>"}``. Arguments are passed as given (file paths,
strings, dicts), the way OSWorld's ``DesktopEnv.evaluate`` calls ``metric(result, expected, **options)``.
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
    "librosa": "audio analysis with numba/llvmlite; only vlc.compare_audios calls it",
    "acoustid": "needs the chromaprint fpcalc binary; only vlc.compare_audios calls it",
    "fitz": "PyMuPDF is not served by this machine's package index",
    "borb": "only chrome.compare_pdf_images' helpers call it",
    "borb.pdf": "only chrome.compare_pdf_images' helpers call it",
}


def _shims() -> None:
    """Opt-in replacements that do work (``OSWORLD_REFERENCE_SHIMS=fitz``): ``shim_<name>.py`` beside this file
    becomes module ``<name>``, so a function whose only missing piece is that import can still be checked."""
    for name in filter(None, os.environ.get("OSWORLD_REFERENCE_SHIMS", "").split(",")):
        sys.modules[name] = importlib.import_module(f"shim_{name}")


class _Missing:
    """A name imported from a stand-in module: importing it works, using it raises."""

    def __init__(self, what: str) -> None:
        self._what = what

    def _fail(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"stand-in {self._what} used ({STAND_INS[self._what.rsplit('.', 1)[0]]})")

    __call__ = _fail

    def __getattr__(self, name: str) -> None:
        self._fail()


def _missing(module: str):  # noqa: ANN202
    def attribute(name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{module}.{name}")

    return attribute


def _stand_in(name: str) -> None:
    top = name.split(".")[0]
    if name in sys.modules or (top not in sys.modules and importlib.util.find_spec(top) is not None):
        return
    module = types.ModuleType(name)
    module.__doc__ = f"stand-in: {STAND_INS[name]}"
    module.__getattr__ = _missing(name)  # type: ignore[method-assign]  # `from X import Y` loads, using Y fails
    sys.modules[name] = module
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, module)


def _register_packages() -> None:
    spec = importlib.util.find_spec("desktop_env")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("desktop-env is not installed in this environment (scripts/setup-osworld-reference)")
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
        try:
            func = getattr(load(req["module"]), req["func"])
            score = func(*req.get("args", []), **req.get("kwargs", {}))
            answer: dict[str, object] = {"score": float(score)}
        except BaseException as exc:  # noqa: BLE001  (the answer is the reference's behaviour, whatever it is)
            answer = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
