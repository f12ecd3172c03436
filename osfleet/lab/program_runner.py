"""Runs one Pulumi Python program for osfleet's language host, in a child process of its own.

The language host (``osfleet.lab.language_host``) starts this file by path with the Python of the *project's*
virtualenv, which need not have osfleet installed: it imports only the standard library and the ``pulumi``
SDK. Running the program in a child keeps its imports, threads, event loop and any crash out of the host,
which must outlive it to report what happened (Pulumi's own host does the same with its exec shim).

What the engine sent in its ``RunRequest`` arrives as flags (monitor and engine addresses, project, root
directory, stack, organization, working directory, dry run, parallelism) plus the environment variables
``PULUMI_CONFIG`` (JSON object of config) and ``PULUMI_CONFIG_SECRET_KEYS`` (JSON list) that
``pulumi.runtime.config`` reads.

Exit codes: 0 the program finished; ``REPORTED`` (32, the code Pulumi's language hosts agree on) the error
was already sent to the engine as a diagnostic, so the engine prints it and nothing more. A config mistake
(``pulumi.RunError``, osfleet's own errors) is sent as its one-line message; any other exception as the
traceback of the program's own frames, since that is a bug to fix.
"""

import os  # (both already imported by the interpreter's start-up, so nothing can shadow them)
import sys

# Run by path, this file's folder would come first on sys.path and shadow modules with the names of its
# neighbours; the program's own folder is put there by runpy instead.
if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import logging  # noqa: E402
import runpy  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

REPORTED = 32
# Errors whose message is meant for the user as it is (osfleet's hierarchy): matched by name so that this
# file does not import osfleet, which the project's virtualenv may not have.
USER_ERROR_BASES = {"osfleet.errors.OsfleetError"}


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="program_runner", description="run a Pulumi Python program")
    for flag in ("monitor", "engine", "project", "root_directory", "stack", "organization", "pwd", "tracing"):
        ap.add_argument(f"--{flag}")
    ap.add_argument("--dry_run", default="false")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("program")
    ap.add_argument("args", nargs="*")
    return ap.parse_args(argv)


def _is_user_error(exc: BaseException) -> bool:
    import pulumi

    if isinstance(exc, pulumi.RunError):
        return True
    return any(f"{c.__module__}.{c.__qualname__}" in USER_ERROR_BASES for c in type(exc).__mro__)


def _program_traceback(exc: BaseException, program: str) -> str:
    """The traceback from the program's first frame on (the runner's and runpy's frames are noise)."""
    frames = traceback.extract_tb(exc.__traceback__)
    base = os.path.abspath(program)
    for i, frame in enumerate(frames):
        if not frame.filename.startswith("<") and os.path.abspath(frame.filename).startswith(base):
            return "".join(traceback.format_exception(exc, limit=-(len(frames) - i))).rstrip()
    return "".join(traceback.format_exception(exc)).rstrip()


def main(argv: list[str]) -> int:
    try:
        import pulumi
        import pulumi.runtime
    except ImportError as exc:
        print(
            f"the Pulumi SDK is not installed in {sys.prefix} ({exc}); run 'pulumi install' or "
            f"'{sys.executable} -m pip install pulumi'",
            file=sys.stderr,
        )
        return 1
    args = _parse(argv)
    pulumi.runtime.set_all_config(pulumi.runtime.get_config_env(), pulumi.runtime.get_config_secret_keys_env())
    settings = pulumi.runtime.Settings(
        monitor=args.monitor,
        engine=args.engine,
        project=args.project,
        stack=args.stack,
        parallel=args.parallel,
        dry_run=args.dry_run == "true",
        organization=args.organization,
        root_directory=args.root_directory,
    )
    pulumi.runtime.configure(settings)
    if args.pwd:
        os.chdir(args.pwd)
    program = os.path.abspath(args.program)
    sys.argv = [program, *args.args]

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    executor = ThreadPoolExecutor(max_workers=min(max(args.parallel, 1), 64) * 4)
    loop.set_default_executor(executor)
    # A failed resource leaves parts of the program's graph unresolved on purpose; asyncio would log each.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    code = 0
    try:
        if os.path.isdir(program) and not os.path.isfile(os.path.join(program, "__main__.py")):
            pulumi.log.error(f"no __main__.py in the program folder {program} (Pulumi.yaml's 'main')")
            return REPORTED

        def run() -> None:
            runpy.run_path(program, run_name="__main__")

        loop.run_until_complete(pulumi.runtime.run_in_stack(run))
    except KeyboardInterrupt:
        pulumi.log.error("the program was interrupted")
        code = REPORTED
    except Exception as exc:  # noqa: BLE001 -- every failure of the program is reported to the engine
        if _is_user_error(exc):
            pulumi.log.error(str(exc))
        else:
            pulumi.log.error("the program failed with an unhandled exception:\n" + _program_traceback(exc, program))
        code = REPORTED
    finally:
        executor.shutdown(wait=True)
        loop.close()
        sys.stdout.flush()
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
