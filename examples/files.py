"""Files in and out of a desktop: put an episode's input into it, let the desktop work on it, take the result out.

    python examples/files.py --url http://127.0.0.1:8080 --token-file /var/lib/osfleet/api-token

A CSV goes into the desktop user's home (its folder is made), a step ranks it there as that user, and the ranked
file comes back. Files travel as bytes, as the desktop user (its permissions decide), and only under /home/user/
or /tmp/: anything else is refused (``ForbiddenError``), a missing file is ``NotFoundError``.
"""

from __future__ import annotations

import argparse
import os

from osfleet.client import Fleet, ForbiddenError, NotFoundError

SCORES = b"name,score\ncarol,7\nalice,9\nbob,8\n"
RANK = "tail -n +2 ~/data/scores.csv | sort -t, -k2 -rn > ~/data/ranked.csv"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token-file", default=None, help="default: $OSFLEET_API_TOKEN")
    args = p.parse_args()
    with Fleet(args.url, token_file=args.token_file) as fleet, fleet.lease(holder="files-example") as session:
        written = session.upload("/home/user/data/scores.csv", SCORES)
        print(f"uploaded {written} bytes to /home/user/data/scores.csv")
        session.step({"type": "shell", "command": RANK}, observe=False)
        ranked = session.download("/home/user/data/ranked.csv")
        print(f"ranked in the desktop: {' '.join(ranked.decode().split())}")

        blob = os.urandom(1 << 20)  # any bytes, not only text
        session.upload("/tmp/blob.bin", blob)
        print(f"1 MiB of random bytes back unchanged: {session.download('/tmp/blob.bin') == blob}")

        for refused in ("/etc/passwd", "/home/user/../../etc/passwd"):
            try:
                session.download(refused)
            except ForbiddenError as exc:
                print(f"refused: {exc}")
        try:
            session.download("/home/user/no-such-file")
        except NotFoundError as exc:
            print(f"not found: {exc}")


if __name__ == "__main__":
    main()
