"""An E2B client's commands run in the guest as the desktop user, detached, their output followed as it comes.

E2B's daemon starts a process and streams its output while it runs; it can be left running (``background=True``),
reconnected to, signalled. osfleet reaches a guest only through steps, and a step's shell command answers once it
has exited (the guest agent returns its output then). So a command is run in two parts:

- **launch**: one step writes the command to a folder of its own (``STATE_DIR/<nonce>``: ``cmd``, ``env``,
  ``cwd``) and starts a small bash script there in a new session, detached from the step (``setsid -f``); that
  script starts the command as ``bash -l -c CMD`` in a session of its own (so its process group is its pid, the
  pid E2B's client sees), output to files, and writes the exit status once it ends. The same step then waits in the
  guest for up to ``LAUNCH_WAIT`` seconds for it to end, and answers what it printed: a quick command (most are)
  costs one step.
- **follow**: further steps read what was added to the output files since the last read, waiting in the guest up to
  ``FOLLOW_WAIT`` seconds for something new; nothing is waited on while no client follows the command.

Every step answers one ``Frame``: a header line (``osfleet-e2b PID STATUS OUT_SIZE ERR_SIZE``) then the new bytes of
stdout and of stderr, each base64 on a line, at most ``MAX_CHUNK`` each. The exit status is read before the sizes,
so once it is there the sizes are final and the output ends there. The guest is hostile: the frame is parsed
strictly and bounded (``parse_frame``); the bytes themselves go to the client as they are, never interpreted here.

The commands run as the desktop user, through osfleet's ``cli_command`` (never root); signals go to the command's
process group as that user. The folder is the user's own (mode 700 under ``/tmp``): what the agent could change
there is its own commands' output, nothing of the host's.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

STATE_DIR = "/tmp/.osfleet-e2b"  # the desktop user's folder of running commands, one sub-folder each
LAUNCH_WAIT = 2.0  # seconds the launching step waits in the guest for the command to end
FOLLOW_WAIT = 0.5  # seconds a following step waits in the guest for new output
PID_WAIT = 10.0  # seconds a launching step waits for the detached command to have started at all
MAX_CHUNK = 256 * 1024  # bytes of stdout (and of stderr) one step brings back
STEP_SLACK = 15.0  # seconds a step's shell command may take beyond its waits (TCG guests are slow to fork)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
FRAME_HEADER = re.compile(r"^osfleet-e2b (\d{1,10}|-) (\d{1,3}|-) (\d{1,15}) (\d{1,15})$")
MAX_B64_LINE = 4 * (MAX_CHUNK // 3 + 1)

# The detached part: starts the command in a session of its own, records its pid, then its exit status. Fixed
# text: the client's command, environment and folder reach it only as files of its folder ($1).
RUNNER = r"""d=$1
set -a
. "$d/env"
set +a
if [ -s "$d/cwd" ] && ! cd -- "$(cat -- "$d/cwd")" 2>"$d/err"; then
  : >"$d/out"; echo $$ >"$d/pid"; echo 1 >"$d/rc"; exit 0
fi
setsid /bin/bash -l -c "$(cat -- "$d/cmd")" </dev/null >"$d/out" 2>"$d/err" &
echo $! >"$d/pid.t" && mv -f "$d/pid.t" "$d/pid"
wait $!
echo $? >"$d/rc.t" && mv -f "$d/rc.t" "$d/rc"
"""

# Waits (up to $w ms; for the pid up to $p ms) until the command ended, or (when $any) until it printed more than
# $o/$e bytes, then answers the frame. Bash for $EPOCHREALTIME: the clock without a process per look.
FOLLOWER = r"""now() { local t=${EPOCHREALTIME//[!0-9]/}; echo $((10#$t / 1000)); }
start=$(now)
while :; do
  [ -f "$d/rc" ] && break
  t=$(( $(now) - start ))
  if [ -f "$d/pid" ]; then
    [ "$t" -ge "$w" ] && break
    if [ "$any" = 1 ]; then
      so=$(stat -c %s "$d/out" 2>/dev/null || echo 0); se=$(stat -c %s "$d/err" 2>/dev/null || echo 0)
      { [ "$so" -gt "$o" ] || [ "$se" -gt "$e" ]; } && break
    fi
  elif [ "$t" -ge "$p" ]; then
    break
  fi
  sleep 0.05
done
rc=-; [ -f "$d/rc" ] && rc=$(cat "$d/rc")
pid=-; [ -f "$d/pid" ] && pid=$(cat "$d/pid")
so=$(stat -c %s "$d/out" 2>/dev/null || echo 0); se=$(stat -c %s "$d/err" 2>/dev/null || echo 0)
echo "osfleet-e2b $pid $rc $so $se"
tail -c +$((o + 1)) "$d/out" 2>/dev/null | head -c "$c" | base64 -w0; echo
tail -c +$((e + 1)) "$d/err" 2>/dev/null | head -c "$c" | base64 -w0; echo
"""


class GuestProtocolError(Exception):
    """The guest answered a command's step with something that is not a frame (never trusted, never half-read)."""


@dataclass(frozen=True)
class Frame:
    """One step's news of a command: its pid (None: it never started), exit status once it ended, new output."""

    pid: int | None
    exit_code: int | None
    out: bytes
    err: bytes
    out_size: int
    err_size: int


def new_nonce() -> str:
    """A fresh name for a command's folder."""
    return secrets.token_hex(8)


def folder(nonce: str) -> str:
    return f"{STATE_DIR}/{nonce}"


def env_file(envs: Mapping[str, str]) -> str:
    """The environment as lines the runner sources (``KEY='value'``); a name that is not a shell variable's, or a
    NUL in a value, is refused (``ValueError``) rather than mangled."""
    lines = []
    for key, value in envs.items():
        if not ENV_NAME.match(key):
            raise ValueError(f"environment variable name {key[:60]!r} is not a shell variable's name")
        if "\x00" in value:
            raise ValueError(f"environment variable {key} holds a NUL byte")
        lines.append(f"{key}={shlex.quote(value)}\n")
    return "".join(lines)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _follower(nonce: str, out_offset: int, err_offset: int, wait: float, any_output: bool, pid_wait: float) -> str:
    values = {
        "d": folder(nonce),
        "o": str(out_offset),
        "e": str(err_offset),
        "w": str(round(wait * 1000)),
        "p": str(round(pid_wait * 1000)),
        "any": "1" if any_output else "0",
        "c": str(MAX_CHUNK),
    }
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()) + FOLLOWER


def launch_command(nonce: str, command: str, envs: Mapping[str, str], cwd: str | None) -> str:
    """The shell command of the step that starts ``command`` (its folder ``nonce``) and waits ``LAUNCH_WAIT``."""
    d = shlex.quote(folder(nonce))
    setup = [
        "umask 077",
        f"mkdir -p {shlex.quote(STATE_DIR)}",
        f"mkdir {d}",
        f"printf %s {_b64(command)} | base64 -d >{d}/cmd",
        f"printf %s {_b64(env_file(envs))} | base64 -d >{d}/env",
        f"printf %s {_b64(cwd or '')} | base64 -d >{d}/cwd",
        f"printf %s {_b64(RUNNER)} | base64 -d >{d}/run",
        f"setsid -f /bin/bash {d}/run {d} </dev/null >/dev/null 2>&1",
    ]
    script = " && ".join(setup) + " || exit 97\n" + _follower(nonce, 0, 0, LAUNCH_WAIT, False, PID_WAIT)
    return "/bin/bash -c " + shlex.quote(script)


def follow_command(nonce: str, out_offset: int, err_offset: int, wait: float = FOLLOW_WAIT) -> str:
    """The shell command of a step that reads what the command printed past the offsets, waiting ``wait``."""
    return "/bin/bash -c " + shlex.quote(_follower(nonce, out_offset, err_offset, wait, True, 0.0))


def signal_command(pid: int, signal: str) -> str:
    """The shell command that sends ``signal`` (TERM, KILL) to the command's process group."""
    if signal not in ("TERM", "KILL"):
        raise ValueError(f"signal {signal!r}: only TERM and KILL are sent")
    return f"kill -s {signal} -- -{int(pid)}"


def remove_command(nonce: str) -> str:
    """The shell command that removes a command's folder once nobody follows it."""
    return f"rm -rf -- {shlex.quote(folder(nonce))}"


def launch_timeout() -> float:
    return LAUNCH_WAIT + PID_WAIT + STEP_SLACK


def follow_timeout(wait: float = FOLLOW_WAIT) -> float:
    return wait + STEP_SLACK


def parse_frame(stdout: str) -> Frame:
    """A step's answer as a ``Frame``; anything else raises ``GuestProtocolError`` (the guest is not trusted)."""
    lines = stdout.split("\n")
    if len(lines) != 4 or lines[3] != "":
        raise GuestProtocolError(f"the guest answered {len(lines) - 1} lines, not a frame of 3")
    head = FRAME_HEADER.match(lines[0])
    if head is None:
        raise GuestProtocolError(f"the guest answered {lines[0][:80]!r}, not a frame's header")
    pid, status, out_size, err_size = head.groups()
    chunks = []
    for line in lines[1:3]:
        if len(line) > MAX_B64_LINE:
            raise GuestProtocolError(f"the guest answered {len(line)} characters of output, over {MAX_B64_LINE}")
        try:
            chunks.append(base64.b64decode(line, validate=True))
        except (binascii.Error, ValueError):
            raise GuestProtocolError("the guest answered output that is not base64") from None
    return Frame(
        pid=None if pid == "-" else int(pid),
        exit_code=None if status == "-" else int(status),
        out=chunks[0],
        err=chunks[1],
        out_size=int(out_size),
        err_size=int(err_size),
    )
