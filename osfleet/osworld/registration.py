"""``register()``: make desktop-env's ``DesktopEnv(provider_name="osfleet")`` lease from an osfleet fleet.

desktop-env has no plug-in point for providers: its factory (``desktop_env.providers.create_vm_manager_and_provider``)
is a closed if/elif that raises for any other name, and ``DesktopEnv.__init__`` rejects a name outside its own
sets (``ValueError("Invalid provider name")``) right after calling the factory. Third parties change those two
places in desktop-env's source; ``register`` changes them at run time instead, and only for the name ``osfleet``:

1. the factory, where it is defined and where ``desktop_env.desktop_env`` imported it by name (the one
   ``DesktopEnv.__init__`` calls), is wrapped: ``"osfleet"`` (and the stand-in name below, while an osfleet
   ``DesktopEnv`` is being made) gives osfleet's manager and provider; every other name goes to desktop-env's own;
2. ``DesktopEnv.__init__`` is wrapped: for ``provider_name="osfleet"`` it runs desktop-env's own ``__init__`` with
   the name ``"docker"`` (``STAND_IN``) and sets ``provider_name`` back to ``"osfleet"`` when it returns. Under
   that name ``__init__`` treats the machine as desktop-env treats its Docker and cloud providers, which is what a
   leased replica is: it starts clean (the first ``reset`` does not revert it), ``path_to_vm`` is not a local
   file to make absolute, and the client password is OSWorld's default (``password``). Every other name runs
   ``__init__`` unchanged.

Both wrappers keep the original (``__wrapped__``), so ``register`` is idempotent (a second call only replaces the
settings, for the leases that follow it) and ``unregister`` puts desktop-env back as it was. ``OsfleetProvider``
and ``OsfleetVMManager`` are registered as virtual subclasses of desktop-env's ``Provider`` and ``VMManager``.
Replicas still leased when the interpreter exits are given back (``atexit``).
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

from osfleet.osworld import assets
from osfleet.osworld.provider import Connect, OsfleetProvider, OsfleetVMManager, Registration, connect
from osfleet.osworld.settings import HarnessSettings

PROVIDER_NAME = "osfleet"
STAND_IN = "docker"  # the name DesktopEnv.__init__ runs under for "osfleet" (see the module's docstring)
FACTORY = "create_vm_manager_and_provider"
MARK = "__osfleet_osworld__"  # set on our wrappers (``__wrapped__`` alone could be another library's decorator)

_registration: Registration | None = None
_making: contextvars.ContextVar[bool] = contextvars.ContextVar("osfleet_desktop_env_in_init", default=False)
_exit_hook_installed = False


def _is_ours(name: object) -> bool:
    return isinstance(name, str) and name.lower().strip() == PROVIDER_NAME


def _current() -> Registration:
    if _registration is None:
        raise RuntimeError("osfleet.osworld.register() has not been called")
    return _registration


def _wrap_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_vm_manager_and_provider(provider_name: str, *args: Any, **kwargs: Any) -> Any:
        if _is_ours(provider_name) or (_making.get() and provider_name == STAND_IN):
            region = args[0] if args else kwargs.get("region")
            registration = _current()
            return OsfleetVMManager(registration), OsfleetProvider(registration, region)
        return original(provider_name, *args, **kwargs)

    setattr(create_vm_manager_and_provider, MARK, True)
    return create_vm_manager_and_provider


def _wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        name = bound.arguments.get("provider_name", signature.parameters["provider_name"].default)
        if not _is_ours(name):
            original(self, *args, **kwargs)
            return
        bound.arguments["provider_name"] = STAND_IN
        token = _making.set(True)
        try:
            original(*bound.args, **bound.kwargs)
        except BaseException:
            provider = getattr(self, "provider", None)
            if isinstance(provider, OsfleetProvider):  # __init__ failed after leasing: give the replica back
                provider.stop_emulator("")
            raise
        finally:
            _making.reset(token)
        self.provider_name = PROVIDER_NAME

    setattr(__init__, MARK, True)
    return __init__


def _close_at_exit() -> None:
    if _registration is not None:
        _registration.close()


def register(settings: HarnessSettings | None = None, *, connect: Connect = connect) -> None:
    """Let ``DesktopEnv(provider_name="osfleet", ...)`` lease from an osfleet fleet (the module's docstring says
    how; ``osfleet.osworld.settings`` which fleet). Idempotent; ``connect`` makes the fleet client (tests)."""
    global _registration, _exit_hook_installed
    try:
        from desktop_env import desktop_env as env_module
        from desktop_env import providers
        from desktop_env.providers.base import Provider, VMManager
    except ImportError as exc:
        raise ImportError(
            f"osfleet.osworld.register needs OSWorld's desktop-env (pip install desktop-env): {exc}"
        ) from exc
    if _registration is None:
        _registration = Registration(settings or HarnessSettings(), connect)
    else:  # again: the settings apply to the next lease; replicas leased already are kept
        _registration.reconfigure(settings or HarnessSettings(), connect)
    for module in (providers, env_module):
        factory = getattr(module, FACTORY)
        if not getattr(factory, MARK, False):
            setattr(module, FACTORY, _wrap_factory(factory))
    cls = env_module.DesktopEnv
    if not getattr(cls.__init__, MARK, False):
        cls.__init__ = _wrap_init(cls.__init__)  # type: ignore[method-assign]
    Provider.register(OsfleetProvider)
    VMManager.register(OsfleetVMManager)
    assets.install()
    if not _exit_hook_installed:
        atexit.register(_close_at_exit)
        _exit_hook_installed = True


def unregister() -> None:
    """Give back every replica still leased and put desktop-env's factory and ``DesktopEnv.__init__`` back."""
    global _registration
    previous, _registration = _registration, None
    if previous is not None:
        previous.close()
    assets.uninstall()
    try:
        from desktop_env import desktop_env as env_module
        from desktop_env import providers
    except ImportError:
        return
    for module in (providers, env_module):
        factory = getattr(module, FACTORY)
        if getattr(factory, MARK, False):
            setattr(module, FACTORY, factory.__wrapped__)
    cls = env_module.DesktopEnv
    if getattr(cls.__init__, MARK, False):
        cls.__init__ = cls.__init__.__wrapped__  # type: ignore[method-assign]
