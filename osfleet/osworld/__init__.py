"""OSWorld's own harness on an osfleet fleet: ``register()``, then ``DesktopEnv(provider_name="osfleet", ...)``.

DESIGN (issue 29, part 2)
=========================

What it does::

    import osfleet.osworld
    from desktop_env.desktop_env import DesktopEnv

    osfleet.osworld.register()          # the fleet from $OSFLEET_URL, its token from $OSFLEET_TOKEN(_FILE)
    env = DesktopEnv(provider_name="osfleet", action_space="pyautogui")   # leases one replica
    obs = env.reset(task_config=task)   # OSWorld's own set-up, through the replica's protocol server
    obs, reward, done, info = env.step("pyautogui.click(100, 200)")
    score = env.evaluate()              # OSWorld's own getters and metrics, on this machine
    env.close()                         # gives the replica back

Pieces (each module's docstring has its details):

- ``registration``: ``register``/``unregister``, the two run-time patches of desktop-env (its provider factory,
  and ``DesktopEnv.__init__``'s provider-name check, passed by running it under the stand-in name ``docker``);
- ``provider``: ``OsfleetProvider`` (one lease per ``DesktopEnv``: ``start_emulator`` leases and starts the
  protocol server, ``revert_to_snapshot`` resets, ``stop_emulator`` releases) and ``OsfleetVMManager``
  (``get_vm_path`` is the fleet's URL);
- ``server`` + ``endpoints``: OSWorld's in-VM server protocol on ``127.0.0.1:<port>``, one port per lease,
  every endpoint turned into osfleet client SDK calls (``step`` with ``shell``/``pyautogui`` actions, ``observe``
  with ``include=accessibility_tree,terminal,cursor``, ``upload``/``download``); ``commands``: the guest command
  lines; ``bodies``: the request bodies; ``errors``: the one status table;
- ``settings``: which fleet, which token, the lease's TTL and wait;
- ``guest_http``: VLC's HTTP port (8080 in the guest) on a loopback port of the harness's machine, each request
  asked again in the guest by a ``shell`` step;
- ``assets``: osfleet's asset URLs (``https://assets.osfleet.invalid/...``, a name that never resolves) answered in
  the harness's process from the bundles shipped with osfleet and this machine's asset store, so OSWorld's own
  ``download`` set-up step works on osfleet's task bundles.

Built on ``osfleet.client`` and ``osfleet.protocol`` only (plus osfleet's guest query script,
``osfleet.tasks.osworld_format.guest_query``, which imports nothing of the host's), so it runs on a client-only install;
desktop-env itself is imported by ``register`` alone.

Interface facts this is built against (desktop-env 1.0.2, the newest on PyPI; OSWorld's main of April 2026 has
the same shapes):

- ``DesktopEnv.__init__`` calls ``create_vm_manager_and_provider(provider_name, region, use_proxy=False)``, the
  name it imported from ``desktop_env.providers``; then raises ``ValueError`` for a name outside
  ``{docker, aws, gcp, azure, aliyun, volcengine}`` (starts clean) and ``{vmware, virtualbox}`` (starts dirty);
  ``path_to_vm`` is made absolute for vmware/virtualbox only; ``client_password`` defaults to ``password``
  except on aws. Without ``path_to_vm`` it asks ``manager.get_vm_path(os_type=, region=, screen_size=)``.
- ``_start_emulator``: ``provider.start_emulator(path, headless, os_type)``, then
  ``provider.get_ip_address(path).split(":")``: with more than one part, parts 1-4 are the server, Chrome
  DevTools, VNC and VLC ports (``int``). ``PythonController``/``SetupController`` talk to
  ``http://<part 0>:<server port>``. ``reset`` reverts only when the env was used (a step, or a set-up with
  steps): ``provider.revert_to_snapshot(path, snapshot_name)`` (a different path returned re-registers it with the
  manager: ``delete_vm``, ``add_vm``, ``occupy_vm``), then ``_start_emulator`` again. ``close`` calls
  ``stop_emulator(path)``.
- Requests and the answers read (``controllers/python.py``, ``setup.py``, the getters): ``POST /execute`` and
  ``/setup/execute`` JSON ``{command, shell}`` -> ``{status, output, error, returncode}`` (an agent's action is
  ``["python", "-c", "import pyautogui; import time; pyautogui.FAILSAFE = False; <code>"]``, 90 s read timeout);
  ``/setup/execute_with_verification`` adds ``verification {window_exists, command_success}``,
  ``max_wait_time``, ``check_interval``; ``/setup/launch`` ``{command, shell}`` -> text;
  ``POST /run_python {code}`` -> ``{status, message, need_more, output, error, return_code}`` (a non-200 answer:
  its ``error`` is read); ``POST /run_bash_script {script, timeout, working_dir}`` -> ``{status, output, error,
  returncode}``; ``GET /screenshot`` -> PNG or JPEG bytes (checked by magic number); ``GET /accessibility`` ->
  ``{"AT": xml}``; ``GET /terminal`` -> ``{"output"}``; ``POST /file`` form ``file_path`` -> bytes;
  ``POST /setup/upload`` multipart ``file_path`` + ``file_data``; ``POST /screen_size`` -> ``{width, height}``;
  ``POST /window_size`` form ``app_class_name`` -> ``{width, height}``; ``POST /desktop_path`` ->
  ``{desktop_path}``; ``POST /wallpaper`` -> bytes; ``POST /list_directory {path}`` -> ``{directory_tree}``;
  ``/setup/change_wallpaper``, ``/setup/open_file {path}``; ``/setup/activate_window`` and ``close_window``
  ``{window_name, strict, by_class}``; ``POST /start_recording``, ``POST /end_recording`` -> MP4 bytes. Only
  ``status_code == 200`` is tested: ``PythonController`` retries anything else (3 times, 5 s apart), then logs it
  and returns None; ``SetupController`` logs most failures, and raises for ``/setup/open_file`` and
  ``/setup/upload``: the exception leaves ``DesktopEnv.reset`` (its own 5 tries are for a server that does not
  answer ``/terminal`` at all).
- OSWorld's server also has ``GET /platform`` (text) and ``GET /cursor_position`` (``[x, y]``), served here;
  ``/setup/download_file`` (the VM downloads a URL) is answered 501: replicas have no network, and OSWorld's
  own set-up downloads on its host and sends the file with ``/setup/upload``.

What works: every endpoint above with OSWorld's request and answer shapes (unit-tested against a fake of the
session's methods, ``tests/test_osworld_provider.py``); with desktop-env 1.0.2 installed as OSWorld's users install
it (``scripts/setup-osworld-harness``), ``DesktopEnv`` on office-image replicas runs set-up, observes, executes
pyautogui actions and scores with its own ``evaluate()`` (``tests/test_osworld_harness_vm.py``; the acceptance
check ``osworld-harness``: files, Chrome's DevTools, VLC's HTTP port, the accessibility tree, commands).
Chrome's port is a ``PortForward`` of the lease (``osfleet.client.forward``: each connection a tunnel through the
replica's virtio-serial tunnel channel, ``osfleet.replicas.tunnels``); VLC's a request-by-request relay
(``guest_http``); ``/start_recording`` and ``/end_recording`` record the screen as an MP4 (``recording``);
``run`` runs OSWorld's runners (``run_multienv.py``) with ``--provider_name osfleet``; ``parity`` scores tasks with
OSWorld's evaluator and osfleet's on the same replica.

What remains:

1. Known differences that remain: a step lasts at most the host's 90 s budget (OSWorld's ``/execute`` gives
   120 s, ``/run_bash_script`` what the request says); ``/file`` and ``/wallpaper`` reach files under
   ``/home/user`` and ``/tmp`` only (403 elsewhere), and at most 8 MiB (413); uploads over 16 MiB are refused here
   (``bodies.MAX_UPLOAD_BYTES``); ``/list_directory`` stops at osfleet's query script's node cap and does not
   follow links to folders; ``save_state`` is not wired to osfleet's checkpoints; ``/setup/open_file`` opens with
   ``xdg-open`` as OSWorld's server does, not with osfleet's per-extension openers
   (``osfleet.tasks.osworld_format.convert``).
2. Cost: ``DesktopEnv._get_obs`` asks ``/screenshot``, ``/accessibility`` and maybe ``/terminal`` one after the
   other, each an ``observe`` of its own; one observation with every part, kept for the few milliseconds between
   them, would halve the round trips. A task's set-up commands and getters arrive as steps of the lease, so a host
   that records episodes records them with the agent's actions (each step's metadata names its endpoint).
3. Naming: the harness reads ``$OSFLEET_TOKEN``/``$OSFLEET_TOKEN_FILE`` (issue 29's names) before the client's own
   ``$OSFLEET_API_TOKEN``; whether to keep two names is open.

desktop-env 1.0.2 with its declared dependencies is 259 packages, ~7 GiB (torch 2.5.1 and ten ``nvidia-*-cu12``
wheels through easyocr and transformers), installed in ~2-3 minutes here; ``desktop_env.desktop_env`` imports
easyocr (so torch) when it loads (~6 s). Installed beside osfleet's client (no extra: ``osfleet[client]`` pins
gymnasium 1.x, desktop-env gymnasium 0.28), the two resolve together: the client's own dependencies are ranges.
"""

from osfleet.osworld.provider import ClosedPort, OsfleetProvider, OsfleetVMManager
from osfleet.osworld.registration import PROVIDER_NAME, register, unregister
from osfleet.osworld.server import ProtocolServer
from osfleet.osworld.settings import HarnessSettings

__all__ = [
    "PROVIDER_NAME",
    "ClosedPort",
    "HarnessSettings",
    "OsfleetProvider",
    "OsfleetVMManager",
    "ProtocolServer",
    "register",
    "unregister",
]
