"""MkDocs hooks of the osfleet site (``hooks:`` in mkdocs.yml): the reference pages generated from the code at
build time, and a navigation that lists a page only once it exists.

Generated, never copied by hand (so a route, a metric or a limit added to the code shows up on the next build):
``reference/http-api.md`` and ``reference/openapi.json`` from the host agent's FastAPI app, ``reference/metrics.md``
from the Prometheus registries, ``reference/limits.md`` from the constants that enforce them, and
``reference/task-schema.md`` from the task model. The CLI (mkdocs-click) and the SDK (mkdocstrings) are generated
by their plugins from ``reference/cli.md`` and ``reference/sdk.md``. The benchmarks' index gets its table of headline
figures from the newest dated pages' front matter, and a page a newer one supersedes says so at its top.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.plugins.osfleet")


# --- the navigation: entries for pages that do not exist (yet) are left out ------------------------------------
def _existing(nav: Any, docs_dir: Path) -> Any:
    """``nav`` without the entries whose Markdown file is missing (other people's pages appear once they land);
    a section left empty disappears too. Generated pages are listed under ``GENERATED`` and always kept."""
    if isinstance(nav, list):
        kept = [entry for entry in (_existing(e, docs_dir) for e in nav) if entry is not None]
        return kept or None
    if isinstance(nav, dict):
        (title, value), *_ = nav.items()
        inner = _existing(value, docs_dir)
        return {title: inner} if inner is not None else None
    if isinstance(nav, str):
        if "://" in nav or nav in GENERATED or (docs_dir / nav).is_file():
            return nav
        log.info("nav: %s is not written yet; left out", nav)
        return None
    return nav


DOCS_DIR = Path("docs")


def _with_dated_benchmarks(nav: list[Any], docs_dir: Path) -> list[Any]:
    """Dated benchmark pages (``benchmarks/<YYYY-MM-DD>-<name>.md``, as ``osfleet report --benchmark-page`` writes
    them) join the Benchmarks section by themselves, newest first, after its index."""
    dated = sorted((p for p in (docs_dir / "benchmarks").glob("[0-9][0-9][0-9][0-9]-*.md")), reverse=True)
    for entry in nav:
        if isinstance(entry, dict) and "Benchmarks" in entry:
            section = entry["Benchmarks"]
            listed = {v if isinstance(v, str) else next(iter(v.values())) for v in section}
            new = [f"benchmarks/{p.name}" for p in dated if f"benchmarks/{p.name}" not in listed]
            entry["Benchmarks"] = section[:1] + new + section[1:]
    return nav


# --- the benchmarks: a headline table from the newest dated pages, older pages marked superseded ----------------
DATED = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-(?P<name>[a-z0-9-]+)\.md$")
HEADLINE_MARK = "<!-- headline-figures -->"


@dataclass(frozen=True)
class BenchmarkPage:
    """A dated page of ``docs/benchmarks`` and what its front matter says: ``headline`` (a list of ``{what: ...,
    value: ...}``, each value as the page's body has it) and ``supersedes`` (older pages, by file stem, whose
    figures this one replaces; a newer page of the same name replaces the older one by itself)."""

    path: Path
    date: str
    name: str
    title: str
    headline: tuple[tuple[str, str], ...]
    supersedes: tuple[str, ...]
    body: str

    @property
    def stem(self) -> str:
        return self.path.stem


def benchmark_pages(docs_dir: Path) -> list[BenchmarkPage]:
    """Every dated benchmark page, newest first."""
    from mkdocs.utils.meta import get_data

    pages = []
    for path in sorted((docs_dir / "benchmarks").glob("*.md"), reverse=True):
        found = DATED.match(path.name)
        if not found:
            continue
        body, meta = get_data(path.read_text())
        title = next((ln[2:].strip() for ln in body.splitlines() if ln.startswith("# ")), path.stem)
        headline = tuple((str(h["what"]), str(h["value"])) for h in meta.get("headline") or [])
        pages.append(BenchmarkPage(path, found["date"], found["name"], title, headline,
                                   tuple(meta.get("supersedes") or []), body))  # fmt: skip
    return pages


def superseded_by(pages: list[BenchmarkPage]) -> dict[str, BenchmarkPage]:
    """Each older page's newest replacement: a later page of the same name, or one that names it in ``supersedes``."""
    out: dict[str, BenchmarkPage] = {}
    for newer in reversed(pages):  # oldest first, so the newest replacement is written last
        for older in pages:
            if older.date < newer.date and (older.name == newer.name or older.stem in newer.supersedes):
                out[older.stem] = newer
    return out


def headline_table(pages: list[BenchmarkPage]) -> str:
    """The current figures: one row per headline figure of each page no newer page supersedes, newest first."""
    gone = superseded_by(pages)
    lines = ["| figure | value | page |", "|---|---|---|"]
    for page in (p for p in pages if p.stem not in gone):
        link = f"[{_cell(page.title)}]({page.path.name})"
        for what, value in page.headline or (("(see the page)", ""),):
            lines.append(f"| {_cell(what)} | {_cell(value)} | {link} |")
    older = [p for p in pages if p.stem in gone]
    note = f"{len(older)} older pages, superseded, are listed in the navigation below these." if older else ""
    return "\n".join([*lines, "", note]).strip() + "\n"


def superseded_note(newer: BenchmarkPage) -> str:
    return (
        f'!!! warning "Superseded"\n    Newer figures: [{newer.title}]({newer.path.name}). This page is kept as the '
        "record of what was measured then.\n\n"
    )


def on_page_markdown(markdown: str, page: Any, config: MkDocsConfig, files: Files) -> str:
    """The benchmarks index gets its headline table; a superseded dated page says so, with a link, at its top."""
    src = page.file.src_uri
    if src == "benchmarks/index.md" and HEADLINE_MARK in markdown:
        return markdown.replace(HEADLINE_MARK, headline_table(benchmark_pages(DOCS_DIR)))
    found = DATED.match(Path(src).name)
    if src.startswith("benchmarks/") and found:
        newer = superseded_by(benchmark_pages(DOCS_DIR)).get(Path(src).stem)
        if newer is not None:
            title_end = markdown.find("\n", markdown.find("# ")) + 1
            return markdown[:title_end] + "\n" + superseded_note(newer) + markdown[title_end:]
    return markdown


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    global DOCS_DIR
    DOCS_DIR = Path(config["docs_dir"])
    config["nav"] = _existing(_with_dated_benchmarks(config["nav"], DOCS_DIR), DOCS_DIR)
    return config


def link_if_written(text: str, page: str, relative: str) -> str:
    """``[text](relative)`` once ``page`` (another contributor's, maybe) exists; plain text until then."""
    return f"[{text}]({relative})" if (DOCS_DIR / page).is_file() else text


# --- JSON schema → Markdown --------------------------------------------------------------------------------------
def _anchor(name: str) -> str:
    return "schema-" + name.lower()


def type_of(schema: dict[str, Any], link: Callable[[str], str]) -> str:
    """A schema's type in one line: ``[Name](#schema-name)`` for a reference, ``list of X``, ``A | B``, enums."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return link(name)
    for union in ("anyOf", "oneOf"):
        if union in schema:
            parts = [type_of(s, link) for s in schema[union]]
            return " \\| ".join(dict.fromkeys(parts))
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return type_of(schema["allOf"][0], link)
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        return f"list of {type_of(items, link)}" if isinstance(items, dict) and items else "list"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"map of {type_of(extra, link)}" if isinstance(extra, dict) and extra else "object"
    if isinstance(kind, list):
        return " \\| ".join(kind)
    if kind == "string" and schema.get("format") == "binary":
        return "bytes"  # a file's, as they are (application/octet-stream)
    return str(kind or "any")


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _bounds(schema: dict[str, Any]) -> str:
    words = {
        "minimum": "≥",
        "exclusiveMinimum": ">",
        "maximum": "≤",
        "exclusiveMaximum": "<",
        "minLength": "length ≥",
        "maxLength": "length ≤",
        "minItems": "items ≥",
        "maxItems": "items ≤",
        "pattern": "matches",
    }
    found = [f"{w} `{schema[k]}`" for k, w in words.items() if k in schema]
    for union in ("anyOf", "oneOf"):
        for option in schema.get(union, []):
            if option.get("type") != "null":
                found += [f"{w} `{option[k]}`" for k, w in words.items() if k in option]
    return ", ".join(found)


def schema_table(schema: dict[str, Any], link: Callable[[str], str]) -> list[str]:
    """An object schema as a table of its fields; any other schema as its type."""
    props: dict[str, Any] = schema.get("properties", {})
    if not props:
        return [f"Type: {type_of(schema, link)}", ""]
    required = set(schema.get("required", []))
    lines = ["| field | type | required | default | description |", "|---|---|---|---|---|"]
    for name, prop in props.items():
        default = f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
        about = " ".join(x for x in (prop.get("description", ""), _bounds(prop)) if x)
        mark = "yes" if name in required else ""
        lines.append(f"| `{name}` | {type_of(prop, link)} | {mark} | {_cell(default)} | {_cell(about)} |")
    return [*lines, ""]


def schemas_section(schemas: dict[str, Any], heading: str = "##") -> list[str]:
    out: list[str] = []
    for name in sorted(schemas, key=str.lower):
        schema = schemas[name]
        out += [f'{heading} {name} {{ #{_anchor(name)} data-toc-label="{name}" }}', ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        out += schema_table(schema, lambda n: f"[{n}](#{_anchor(n)})")
    return out


# --- the HTTP API from the host agent's OpenAPI document ---------------------------------------------------------
def host_agent_openapi() -> dict[str, Any]:
    """The document the host agent serves at ``/openapi.json``, from the app itself (no replica host is made: the
    host factory only runs in the app's lifespan)."""
    from osfleet.api.app import create_app
    from osfleet.config import AgentConfig

    def no_host() -> Any:
        raise RuntimeError("the documentation never starts the app")

    return create_app(AgentConfig(token="documentation"), no_host).openapi()


def _parameters(op: dict[str, Any]) -> list[str]:
    params = op.get("parameters", [])
    if not params:
        return []
    lines = ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
    for p in params:
        schema = p.get("schema", {})
        about = " ".join(x for x in (p.get("description", ""), _bounds(schema)) if x)
        lines.append(
            f"| `{p['name']}` | {p['in']} | {type_of(schema, _schema_link)} | {'yes' if p.get('required') else ''} "
            f"| {_cell(about)} |"
        )
    return ["**Parameters**", "", *lines, ""]


def _schema_link(name: str) -> str:
    return f"[{name}](#{_anchor(name)})"


def _body(op: dict[str, Any]) -> list[str]:
    body = op.get("requestBody")
    if not body:
        return []
    media = body.get("content", {})
    kinds = [f"{type_of(m.get('schema', {}), _schema_link)} (`{ctype}`)" for ctype, m in media.items()]
    need = "required" if body.get("required") else "optional"
    return [f"**Request body** ({need}): {', '.join(kinds)}", ""]


def _responses(op: dict[str, Any]) -> list[str]:
    lines = ["| status | meaning | body |", "|---|---|---|"]
    for code, answer in op.get("responses", {}).items():
        media = answer.get("content", {})
        bodies = ", ".join(
            f"{type_of(m.get('schema', {}), _schema_link)} (`{ctype}`)" for ctype, m in media.items() if m
        )
        headers = ", ".join(f"`{h}`" for h in answer.get("headers", {}))
        meaning = _cell(answer.get("description", "")) + (f" (headers: {headers})" if headers else "")
        lines.append(f"| {code} | {meaning} | {bodies} |")
    return ["**Responses**", "", *lines, ""]


def http_api_page(spec: dict[str, Any]) -> str:
    info = spec.get("info", {})
    out = [
        "# HTTP API",
        "",
        f"The contract of the **{info.get('title', 'host agent')}** (version {info.get('version', '?')}), generated "
        "at build time from the FastAPI app's own OpenAPI document: the operations below are the routes the server "
        "has. The fleet gateway (`osfleet fleet serve`) serves the same contract in front of many hosts. The raw "
        "document: [openapi.json](openapi.json); a running agent serves it at `/openapi.json` and an explorer at "
        "`/docs`.",
        "",
        "Every operation but `/health` needs `Authorization: Bearer <token>` (`/metrics` is open to loopback "
        'only). Errors are all `{"error": "<one line>", "kind": "..."}` ([ErrorBody](#schema-errorbody)).',
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method.upper(), path, op))
    for tag, ops in by_tag.items():
        out += [f"## {tag}", ""]
        for method, path, op in ops:
            out += [f"### `{method} {path}`", ""]
            if op.get("summary"):
                out += [f"*{_cell(op['summary'])}*", ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            out += _parameters(op) + _body(op) + _responses(op)
    out += ["## Schemas", ""] + schemas_section(spec.get("components", {}).get("schemas", {}), "###")
    return "\n".join(out) + "\n"


# --- Prometheus metrics ------------------------------------------------------------------------------------------
def metrics_page() -> str:
    from osfleet.api.metrics import Metrics
    from osfleet.fleet.gateway import GatewayMetrics

    out = [
        "# Metrics",
        "",
        "Prometheus metrics, listed from the registries the servers expose at `/metrics` (generated at build "
        "time). A host agent's `/metrics` is open to loopback; elsewhere it needs the operator's token.",
        "",
    ]
    for title, registry in (
        ("Host agent (`osfleet host serve`)", Metrics().registry),
        ("Fleet gateway (`osfleet fleet serve`)", GatewayMetrics().registry),
    ):
        out += [f"## {title}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = sorted({k for s in family.samples for k in s.labels if k not in ("le", "quantile")})
            if not labels:  # a labelled family has no samples before its first use: ask the collector
                collector = registry._names_to_collectors.get(family.name) or registry._names_to_collectors.get(name)
                labels = list(getattr(collector, "_labelnames", ()))
            shown = ", ".join(f"`{x}`" for x in labels)
            out.append(f"| `{name}` | {family.type} | {shown} | {_cell(family.documentation)} |")
        out.append("")
    return "\n".join(out)


# --- limits from the constants that enforce them -----------------------------------------------------------------
@dataclass(frozen=True)
class Limit:
    what: str
    module: str
    name: str
    unit: str  # bytes, seconds, count

    def value(self) -> Any:
        return getattr(import_module(self.module), self.name)

    def shown(self) -> str:
        v = self.value()
        if v is None:
            return "none"
        if self.unit == "bytes":
            for size, word in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
                if v >= size and v % size == 0:
                    return f"{v // size} {word}"
            return f"{v} bytes"
        if self.unit == "seconds":
            return f"{v:g} s" if v < 3600 else f"{v / 3600:g} h"
        return f"{v:g}" if isinstance(v, float) else str(v)


LIMITS: dict[str, list[Limit]] = {
    "Requests": [
        Limit("request body (413 before it is read or authenticated; `--max-body-mib`)", "osfleet.config",
              "DEFAULT_MAX_BODY_BYTES", "bytes"),
        Limit("dashboard login form", "osfleet.api.limits", "LOGIN_MAX_BYTES", "bytes"),
        Limit("children of one fork request", "osfleet.protocol.models", "MAX_FORK_CHILDREN", "count"),
        Limit("replicas started from a checkpoint by one lease request", "osfleet.protocol.models",
              "MAX_CHECKPOINT_COPIES", "count"),
        Limit("worker threads per replica the host may hold (plus a spare pool)", "osfleet.api.limits",
              "THREADS_PER_REPLICA", "count"),
        Limit("spare worker threads", "osfleet.api.limits", "THREADS_SPARE", "count"),
        Limit("a lease without `ttl_seconds` (the library's default; `host serve --lease-seconds` sets the agent's)",
              "osfleet.replicas.leases", "DEFAULT_LEASE_SECONDS", "seconds"),
    ],
    "Time budgets": [
        Limit("a step's actions together", "osfleet.replicas.actions", "STEP_BUDGET_SECONDS", "seconds"),
        Limit("a task's set-up together", "osfleet.tasks.runner", "SETUP_BUDGET_SECONDS", "seconds"),
        Limit("an evaluation (post-config, getters and metrics)", "osfleet.tasks.runner",
              "EVALUATE_BUDGET_SECONDS", "seconds"),
        Limit("one guest-agent call", "osfleet.replicas.actions", "AGENT_CALL_SECONDS", "seconds"),
        Limit("one guest file read", "osfleet.replicas.actions", "READ_FILE_SECONDS", "seconds"),
        Limit("one file upload or download (PUT/GET /v1/replicas/{id}/files) in the guest",
              "osfleet.replicas.guest_files", "FILE_SECONDS", "seconds"),
    ],
    "What comes out of a guest": [
        Limit("a guest file read for a check (over it: scored 0)", "osfleet.protocol.actions", "MAX_READ_BYTES",
              "bytes"),
        Limit("empty chunks in a row before a read is given up", "osfleet.replicas.actions", "MAX_EMPTY_READS",
              "count"),
        Limit("a downloaded file (over it: 413, never cut short)", "osfleet.replicas.guest_files",
              "MAX_DOWNLOAD_BYTES", "bytes"),
        Limit("a file's path in the desktop (characters)", "osfleet.protocol.models", "MAX_GUEST_PATH", "count"),
        Limit("a metric's address space (above the warm worker's)", "osfleet.tasks.jail.sandbox", "METRIC_MEMORY_BYTES",
              "bytes"),
        Limit("a metric's CPU time", "osfleet.tasks.jail.sandbox", "METRIC_CPU_SECONDS", "seconds"),
        Limit("a metric's wall time (cut to the evaluation's time left)", "osfleet.tasks.jail.sandbox",
              "METRIC_WALL_SECONDS", "seconds"),
        Limit("a metric's wall time, at least", "osfleet.tasks.runner", "METRIC_MIN_SECONDS", "seconds"),
        Limit("files a metric writes", "osfleet.tasks.jail.sandbox", "METRIC_FILE_BYTES", "bytes"),
        Limit("files a metric opens", "osfleet.tasks.jail.sandbox", "METRIC_OPEN_FILES", "count"),
        Limit("processes and threads of one evaluation (its cgroup)", "osfleet.tasks.jail.sandbox", "METRIC_PROCESSES",
              "count"),
        Limit("files in an evaluation's /tmp and /dev/shm together", "osfleet.tasks.jail.zygote", "SCRATCH_INODES",
              "count"),
        Limit("a metric's answer", "osfleet.tasks.jail.sandbox", "REPLY_MAX_BYTES", "bytes"),
    ],
    "Episodes and recordings": [
        Limit("stored results of one step (beyond: long outputs as digests)", "osfleet.replicas.episodes",
              "STEP_RESULTS_MAX_BYTES", "bytes"),
        Limit("stored results of an episode's remembered steps", "osfleet.replicas.episodes",
              "EPISODE_RESULTS_MAX_BYTES", "bytes"),
        Limit("steps remembered per episode (for retries by action id)", "osfleet.replicas.episodes",
              "STEPS_REMEMBERED", "count"),
        Limit("client metadata kept per recorded step", "osfleet.recording.store", "METADATA_MAX_BYTES", "bytes"),
        Limit("text of a recorded result (characters)", "osfleet.recording.store", "RESULT_TEXT_MAX", "count"),
        Limit("text of a recorded action (characters)", "osfleet.recording.store", "ACTION_TEXT_MAX", "count"),
        Limit("frames a second of an episode's MP4", "osfleet.recording.video", "FPS", "count"),
        Limit("the last screen of an episode's MP4 stays on", "osfleet.recording.video", "LAST_SCREEN_SECONDS",
              "seconds"),
        Limit("one episode's share of the recording store (1/N)", "osfleet.recording.recorder", "EPISODE_SHARE",
              "count"),
        Limit("the recording store's share of its file system (1/N)", "osfleet.recording.recorder", "FS_SHARE",
              "count"),
    ],
    "Fair shares per client": [
        Limit("requests in flight, whatever the client holds (429 past its share)", "osfleet.api.admission",
              "SPARE_REQUESTS", "count"),
        Limit("more requests in flight for each replica the client holds", "osfleet.api.admission",
              "REQUESTS_PER_LEASE", "count"),
        Limit("bodies being received, in server body limits (`--max-body-mib`)", "osfleet.api.admission",
              "BODY_SHARE", "count"),
        Limit("each host-wide budget's share one client may hold (`--client-share`): evaluation slots, forks and "
              "checkpoints, recordings", "osfleet.config", "DEFAULT_CLIENT_SHARE", "count"),
        Limit("a 429's `Retry-After`", "osfleet.api.admission", "RETRY_AFTER_SECONDS", "seconds"),
        Limit("a 429's `Retry-After` for an evaluation", "osfleet.api.admission", "EVALUATION_RETRY_AFTER_SECONDS",
              "seconds"),
        Limit("how long the Python client waits out 429s before `ThrottledError`", "osfleet.client.transport",
              "THROTTLED_WAIT", "seconds"),
        Limit("a 429's `Retry-After` when only the client's own forks or checkpoints being saved are in the way",
              "osfleet.replicas.quota", "SAVE_RETRY_AFTER_SECONDS", "seconds"),
        Limit("an OSGym step's body, read before it waits for its vm's turn (413 unread past it)",
              "osfleet.api.osgym_turn", "MAX_STEP_BODY", "bytes"),
        Limit("the file systems a fork or checkpoint must leave free (1/N; 503 `capacity` past it)",
              "osfleet.api.admission", "DISK_RESERVE_SHARE", "count"),
        Limit("what a tunnel holds that the replica has not taken yet", "osfleet.replicas.tunnels", "MAX_QUEUED",
              "bytes"),
        Limit("a tunnel send waits for room at most (then 409, the tunnel closed)", "osfleet.replicas.tunnels",
              "SEND_SECONDS", "seconds"),
        Limit("a tunnel channel that takes nothing is given up after", "osfleet.replicas.tunnels", "WRITE_SECONDS",
              "seconds"),
        Limit("what the guest's relay holds for a service that does not read (then that connection closes)",
              "osfleet.replicas.guest_tunnel", "MAX_PENDING", "bytes"),
    ],
    "Dashboard": [
        Limit("a dashboard session", "osfleet.ui.sessions", "SESSION_SECONDS", "seconds"),
        Limit("dashboard sessions at once", "osfleet.ui.sessions", "MAX_SESSIONS", "count"),
    ],
}  # fmt: skip


def limits_page() -> str:
    out = [
        "# Limits",
        "",
        "Every input is bounded before it is read, and every request ends by a deadline. The values below are read "
        "from the constants that enforce them when the site is built; where a command-line option changes one, the "
        "option is named. Why each exists: "
        + link_if_written("the threat model", "explanation/threat-model.md", "../explanation/threat-model.md")
        + ".",
        "",
    ]
    for section, limits in LIMITS.items():
        out += [f"## {section}", "", "| limit | value | constant |", "|---|---|---|"]
        for limit in limits:
            out.append(f"| {limit.what} | {limit.shown()} | `{limit.module}.{limit.name}` |")
        out.append("")
    return "\n".join(out)


# --- the task format ---------------------------------------------------------------------------------------------
def task_schema_page() -> str:
    from osfleet.tasks.model import Task

    schema = Task.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.pop("$defs", {})
    return "\n".join(
        [
            "# Task schema",
            "",
            "The fields of an osfleet task file (YAML or JSON), generated from `osfleet.tasks.model.Task` at build "
            "time. How to write one: [Task format](task-format.md).",
            "",
            "## Task",
            "",
            *schema_table(schema, _schema_link),
            *schemas_section(defs),
        ]
    )


# --- the generated files -----------------------------------------------------------------------------------------
GENERATED: dict[str, Callable[[], str]] = {
    "reference/http-api.md": lambda: http_api_page(host_agent_openapi()),
    "reference/openapi.json": lambda: json.dumps(host_agent_openapi(), indent=2) + "\n",
    "reference/metrics.md": metrics_page,
    "reference/limits.md": limits_page,
    "reference/task-schema.md": task_schema_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, make in GENERATED.items():
        if files.get_file_from_path(path) is not None:
            raise ValueError(f"docs/{path} is generated at build time: remove the file")
        files.append(File.generated(config, path, content=make()))
    return files
