"""Which fleet the OSWorld provider leases from, and how: given to ``register`` or read from the environment.

The fleet's URL: ``path_to_vm`` when a ``DesktopEnv`` is given one, else ``url``, else ``$OSFLEET_URL``. The
token: ``token``, else the file ``token_file``, else ``$OSFLEET_TOKEN``, else the file ``$OSFLEET_TOKEN_FILE``,
else what the client reads by itself (``$OSFLEET_API_TOKEN``). Nothing is read until a ``DesktopEnv`` starts, so
``register()`` may run before the environment is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from osfleet.client import InvalidRequestError

URL_VARIABLE = "OSFLEET_URL"
TOKEN_VARIABLE = "OSFLEET_TOKEN"
TOKEN_FILE_VARIABLE = "OSFLEET_TOKEN_FILE"
DEFAULT_HOLDER = "osworld-desktop-env"
# A lease's length: one OSWorld task (its 60 s settle, up to 100 steps on an emulated desktop, the evaluation) with
# room to spare, yet a crashed runner's replica comes back within it. A reset with less than RENEW_BELOW_SECONDS
# left leases a new replica instead (the fleet resets the old one), so a runner may go on for days.
DEFAULT_LEASE_SECONDS = 7200.0
RENEW_BELOW_SECONDS = 3600.0
DEFAULT_LEASE_WAIT_SECONDS = 600.0  # a DesktopEnv waits this long for a free replica (then CapacityError)


@dataclass(frozen=True)
class HarnessSettings:
    url: str | None = None
    token: str | None = None
    token_file: str | None = None
    holder: str = DEFAULT_HOLDER
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    renew_below_seconds: float = RENEW_BELOW_SECONDS
    lease_wait_seconds: float = DEFAULT_LEASE_WAIT_SECONDS

    def fleet_url(self, path_to_vm: str | None = None) -> str:
        """The fleet's URL (the module's docstring says where from); ``InvalidRequestError`` when there is none."""
        for url in (path_to_vm, self.url, os.environ.get(URL_VARIABLE)):
            if url and url.strip():
                url = url.strip()
                if not url.startswith(("http://", "https://")):
                    raise InvalidRequestError(f"the fleet's URL must start with http:// or https://, not {url!r}")
                return url.rstrip("/")
        raise InvalidRequestError(
            f"no osfleet URL: set ${URL_VARIABLE}, pass url= to osfleet.osworld.register, or give DesktopEnv "
            "path_to_vm='http://...'"
        )

    def credentials(self) -> tuple[str | None, str | None]:
        """(token, token_file) for ``osfleet.client.Fleet``; both None: the client reads ``$OSFLEET_API_TOKEN``."""
        if self.token:
            return self.token, None
        if self.token_file:
            return None, self.token_file
        if os.environ.get(TOKEN_VARIABLE, "").strip():
            return os.environ[TOKEN_VARIABLE].strip(), None
        if os.environ.get(TOKEN_FILE_VARIABLE, "").strip():
            return None, os.environ[TOKEN_FILE_VARIABLE].strip()
        return None, None
