"""Run by OSWorld's harness Python (scripts/setup-osworld-harness), not by pytest: OSWorld-format tasks through
desktop-env's own ``DesktopEnv`` with osfleet's provider, one JSON line of results on stdout.

argv: the tasks' JSON file (a list; each task may carry ``osfleet_oracle``, shell commands that solve it) and
DesktopEnv's cache folder. For each task: ``reset`` (OSWorld's set-up), the observation's kinds, ``evaluate()``
at s0, the oracle as a pyautogui-space action (Python run in the guest), ``evaluate()`` again.
"""

import json
import sys

import osfleet.osworld

osfleet.osworld.register()
from desktop_env.desktop_env import DesktopEnv  # noqa: E402 (after register, as a user writes it)


def main() -> None:
    with open(sys.argv[1]) as f:
        tasks = json.load(f)
    out = []
    env = DesktopEnv(provider_name="osfleet", action_space="pyautogui", require_a11y_tree=True, headless=True,
                     os_type="Ubuntu", cache_dir=sys.argv[2])  # fmt: skip
    record = "--record" in sys.argv  # the first task's actions recorded as an MP4
    try:
        for t in tasks:
            row = {"id": t["id"]}
            try:
                oracle = t.pop("osfleet_oracle", [])
                obs = env.reset(task_config=t)
                shot, tree = obs.get("screenshot"), obs.get("accessibility_tree")
                row["png"] = isinstance(shot, bytes | bytearray) and bytes(shot[:8]) == b"\x89PNG\r\n\x1a\n"
                row["a11y"] = isinstance(tree, str) and tree.lstrip().startswith("<")
                row["s0"] = env.evaluate()
                if record:  # OSWorld's recording around the oracle's actions, as lib_run_single records an episode
                    env.controller.start_recording()
                for a in oracle:
                    timeout = int(a.get("timeout", 120))
                    code = f"import subprocess; subprocess.run(['bash', '-c', {a['command']!r}], timeout={timeout})"
                    env.step(code, pause=1)
                row["after_oracle"] = env.evaluate()
                if record:
                    video = f"{sys.argv[2]}/{t['id']}.mp4"
                    env.controller.end_recording(video)
                    with open(video, "rb") as f:
                        head = f.read(12)
                    row["mp4"] = head[4:8] == b"ftyp"
                    record = False
            except Exception as e:  # one task's failure is its row; the others still run
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            out.append(row)
    finally:
        env.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
