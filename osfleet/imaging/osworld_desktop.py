"""The desktop OSWorld's tasks expect, added to an image whose recipe sets ``osworld_desktop``.

OSWorld's tasks were written for an Ubuntu GNOME desktop: they export ``unix:path=/run/user/1000/bus`` as the
session bus, call ``google-chrome`` and read its profile under ``~/.config/google-chrome``, ask VLC's HTTP
interface on port 8080 with the password ``password``, run ``code``, ``gnome-terminal`` and ``echo password |
sudo -S ...``. The guest files in ``golden_images/guest/osworld/`` provide each of these on osfleet's small
desktop (openbox, no systemd, no network); this module installs them, and stages code-server:

- **code-server** (VS Code's editor, from npm): the build host downloads the packages (it reaches the npm
  registry; the guest has no network) without running their install scripts; the image's chroot then builds
  the native modules against Debian's own nodejs (``build-code-server``) and the compilers are removed again.
- **Pre-started applications** (``prestart``): the session script ``osfleet-apps`` starts them and writes
  ``/run/user/<uid>/osfleet-apps-ready`` once each answers; ``osfleet.vm.readiness`` waits for that file before a
  running state is saved, so every replica restored from it has them up.
- **The session's environment** (``session.env``: PATH with /usr/local/bin, session bus, runtime folder,
  accessibility on) reaches every command osfleet runs as the desktop user: ``runuser`` and ``su`` read it
  through ``pam_env`` (the guest agent's own PATH lacks /usr/local/bin).

Only recipes with ``osworld_desktop`` get these files, and only theirs count in the image's hash, so the
default desktop keeps its name.
"""

from __future__ import annotations

from shlex import quote as q

from osfleet.imaging.host import Host
from osfleet.recipe import ASSETS_PACKAGE as ASSETS_PACKAGE
from osfleet.recipe import OSWORLD_GUEST_FILES, Recipe

# The files are part of the image's name, so they are listed (and read) in osfleet.recipe.
from osfleet.recipe import osworld_guest_files as guest_files

FILES = OSWORLD_GUEST_FILES

CODE_SERVER_PORT = 13337  # loopback only; 8080 is VLC's HTTP interface, 1337 Chrome's DevTools
READY_FILE = "/run/user/1000/osfleet-apps-ready"
CODE_SERVER_DIR = "/opt/code-server"
# Packages the chroot needs to compile code-server's native modules; removed again after the build.
CODE_SERVER_BUILD_PACKAGES = ["g++", "make", "node-gyp", "libnode-dev"]
# Where the session's environment is read for every command run as the desktop user (see the docstring).
PAM_SERVICES = ("runuser", "su")
PAM_LINE = "session required pam_env.so readenv=1 user_readenv=0 envfile=/etc/osfleet/session.env"


def env(recipe: Recipe) -> dict[str, str]:
    """Lines added to /etc/osfleet/desktop.env (read by the session and the wrappers)."""
    if not recipe.osworld_desktop:
        return {}
    return {
        "OSFLEET_PRESTART": " ".join(recipe.prestart),
        "OSFLEET_CHROME_PORT": str(recipe.chrome_devtools_port or ""),
        "OSFLEET_CODE_PORT": str(CODE_SERVER_PORT),
    }


def stage_code_server(host: Host, recipe: Recipe, work: str, rootfs: str, chroot: str) -> None:
    """Download code-server and VS Code's modules on the build host, then build the native ones in the image."""
    assert recipe.code_server is not None
    stage = f"{work}/code-server"
    npm = "npm install --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error"
    host.run(f"mkdir -p {q(stage)} && {npm} --prefix {q(stage)} {q('code-server@' + recipe.code_server)}", what="npm")
    vscode = f"{stage}/node_modules/code-server/lib/vscode"
    for folder in (vscode, f"{vscode}/extensions"):
        host.run(f"cd {q(folder)} && {npm} --legacy-peer-deps", what="npm (VS Code's modules)")
    host.run(f"cp -a {q(stage)} {q(rootfs + CODE_SERVER_DIR)}")
    tools = " ".join(q(p) for p in CODE_SERVER_BUILD_PACKAGES)
    host.run(f"{chroot} apt-get install -y -q --no-install-recommends {tools}", what="apt-get install (build tools)")
    host.write_file(f"{rootfs}/tmp/build-code-server", guest_files(recipe)["osworld/build-code-server"], 0o755)
    # A clean environment: the build host's (e.g. NODE_EXTRA_CA_CERTS naming a file the image lacks) breaks gyp.
    host.run(
        f"chroot {q(rootfs)} env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C /tmp/build-code-server",
        what="building code-server's native modules",
    )
    host.run(f"rm -f {q(rootfs + '/tmp/build-code-server')} && rm -rf {q(rootfs + '/root/.cache')}")
    host.run(f"{chroot} apt-get purge -y -q --auto-remove {tools}", what="apt-get purge (build tools)")


def configure(host: Host, recipe: Recipe, rootfs: str, chroot: str) -> None:
    """Install the session, wrappers and settings; give the user its password and sudo (after ``useradd``)."""
    files = guest_files(recipe)
    user, home = recipe.user, f"{rootfs}/home/{recipe.user}"

    def put(name: str, path: str, mode: int = 0o644) -> None:
        host.write_file(f"{rootfs}{path}", files[f"osworld/{name}"], mode)

    put("xsession", "/etc/osfleet/xsession", 0o755)
    put("session.env", "/etc/osfleet/session.env")
    put("runtime-dir", "/usr/local/sbin/osfleet-runtime-dir", 0o755)
    put("apps", "/usr/local/bin/osfleet-apps", 0o755)
    host.run(f"mkdir -p {q(rootfs + '/usr/local/lib/osfleet')}")
    put("prewarm-office.py", "/usr/local/lib/osfleet/prewarm-office.py")
    # Where Ubuntu has them (OSWorld's steps call /usr/bin/...); the rest of osfleet's own in /usr/local.
    put("gnome-terminal", "/usr/bin/gnome-terminal", 0o755)
    if recipe.chrome_devtools_port is not None:
        put("google-chrome", "/usr/bin/google-chrome", 0o755)
        host.run(f"ln -sf google-chrome {q(rootfs + '/usr/bin/google-chrome-stable')}")
        put("google-chrome.desktop", "/usr/share/applications/google-chrome.desktop")
    if recipe.code_server:
        put("code-server", "/usr/local/bin/osfleet-code-server", 0o755)
        put("code", "/usr/bin/code", 0o755)
    for service in PAM_SERVICES:
        host.run(f"echo {q(PAM_LINE)} >> {q(f'{rootfs}/etc/pam.d/{service}')}")
    sudoers = f"{user} ALL=(root) NOPASSWD: /usr/local/sbin/osfleet-runtime-dir\n"
    if recipe.password:
        host.run(f"echo {q(f'{user}:{recipe.password}')} | {chroot} chpasswd", what="chpasswd")
        sudoers = f"{user} ALL=(ALL:ALL) ALL\n" + sudoers
    host.write_file(f"{rootfs}/etc/sudoers.d/osfleet", sudoers, 0o440)
    host.run(f"mkdir -p {q(home + '/.config/vlc')} {q(home + '/Desktop')} {q(home + '/Downloads')}")
    host.write_file(f"{home}/.config/vlc/vlcrc", files["osworld/vlcrc"])
    host.run(f"{chroot} chown -R {q(user)}: {q('/home/' + user)}", what="chown")
    host.run(f"{chroot} fc-cache -f", what="fc-cache")  # else each application's first start builds it (slow)
