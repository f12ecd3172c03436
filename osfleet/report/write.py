"""Writing a report: the loaded results and drawn figures become one document (sections of text, tables and
images), rendered into report.md and report.html by the Jinja2 templates shipped in ``templates/``."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from osfleet.measure.cost import PRICES_NAME
from osfleet.measure.stats import human_bytes, seconds
from osfleet.report.figures import Figure
from osfleet.report.load import RunResults, caption, machine_of, trajectory_summary

HERE = "measured here"
TITLE = "osfleet run report"


@dataclass(frozen=True)
class Text:
    text: str
    kind: Literal["text"] = "text"


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]
    kind: Literal["table"] = "table"


@dataclass(frozen=True)
class Image:
    src: str
    alt: str
    kind: Literal["image"] = "image"


Block = Text | Table | Image


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)


def write(results: RunResults, figures: list[Figure]) -> list[Path]:
    """Write report.md, report.html (and cost.json when there is a cost) into the run directory."""
    run_dir = results.run_dir
    sections = document(results, figures)
    env = _environment()
    context = {"title": TITLE, "run_dir": str(run_dir), "sections": sections}
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    md_path.write_text(env.get_template("report.md.j2").render(context))
    html_path.write_text(env.get_template("report.html.j2").render(context))
    if results.cost is not None:
        doc = {"footprint": results.cost.footprint.__dict__, "rows": results.cost.rows}
        (run_dir / "cost.json").write_text(json.dumps(doc, indent=2) + "\n")
    return [md_path, html_path] + [run_dir / f.file for f in figures]


def benchmark_page(results: RunResults, out_dir: Path) -> Path:
    """A dated page of the documentation site's benchmarks (``docs/benchmarks``), written from the run directory:
    the report's sections without their figures (the PNGs stay in the run directory; the repository holds no
    binaries), named ``<date>-<run directory>.md`` so pages sort by when they were measured."""
    machine = machine_of(results.run_dir)
    stamp = str(machine.get("date") or "")
    date = stamp[:10] if re.fullmatch(r"\d{4}-\d{2}-\d{2}.*", stamp) else _modified(results.run_dir)
    sections = [s for s in document(results, []) if s.title != "Figures"]
    for section in sections:
        section.blocks = [b for b in section.blocks if not isinstance(b, Image)]
    slug = re.sub(r"[^a-z0-9]+", "-", results.run_dir.resolve().name.lower()).strip("-") or "run"
    context = {
        "title": f"{machine.get('command') or 'osfleet bench'}, {date}",
        "caption": caption(machine) if machine else "a machine the run directory does not describe",
        "run_name": results.run_dir.resolve().name,
        "sections": sections,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    page = out_dir / f"{date}-{slug}.md"
    page.write_text(_environment().get_template("benchmark.md.j2").render(context))
    return page


def _modified(run_dir: Path) -> str:
    newest = max((p.stat().st_mtime for p in run_dir.iterdir() if p.is_file()), default=run_dir.stat().st_mtime)
    return time.strftime("%Y-%m-%d", time.gmtime(newest))


def document(results: RunResults, figures: list[Figure]) -> list[Section]:
    """The report's sections, in order; key figures are collected from each measured section."""
    key: list[list[str]] = []
    sections: list[Section] = []
    if results.disk is not None:
        sections.append(_disk(results.disk, key))
    if results.boot is not None:
        sections.append(_boot(results.boot, results.run_dir, key))
    if results.resets is not None:
        sections.append(_resets(results.resets, key))
    if results.forks is not None:
        sections.append(_forks(results.forks, key))
    if results.density is not None:
        sections.append(_density(results.density, key))
    if results.load.trajectories or results.load.stats:
        sections.append(_load_test(results, key))
    if results.throughput is not None:
        sections.append(_throughput(results.throughput, key))
    if results.chaos is not None:
        sections.append(_chaos(results.chaos, key))
    if results.infra is not None:
        sections.append(_infra(results.infra, key))
    if results.cost is not None:
        sections.append(_cost(results, key))
    sections.append(
        Section(
            "Compared with published systems",
            [Table(["figure", "osfleet (this run)", "OSGym", "MAI-Gym"], _comparison(results))],
        )
    )
    sections.append(Section("Key figures", [Table(["figure", "value", "source"], key)]))
    sections.append(Section("Figures", [Image(f.file, f.title) for f in figures]))
    return sections


def _chaos(c: dict[str, Any], key: list[list[str]]) -> Section:
    rows = [
        [
            f["kind"],
            f["target"],
            f.get("mechanism", ""),
            f"{f['injected_at']:.0f} s",
            f"{f['recovered_after_s']:.1f} s" if f["recovered_after_s"] is not None else "never",
            f["layer"],
        ]
        for f in c.get("faults", [])
    ]
    text = (
        f"{c.get('fault_kinds')} fault kinds injected into {c.get('hosts')} hosts while {c.get('users')} Locust "
        f"agents ran for {c.get('duration_s')} s through the fleet gateway: {c.get('scored_episodes')} episodes "
        f"scored, {c.get('aborted_episodes')} aborted (unscored), {c.get('collateral_aborts')} aborts with no fault "
        f"behind them; {c.get('lost_actions')} acknowledged steps missing from the hosts' audit logs, "
        f"{c.get('duplicated_actions')} applied twice; {c.get('unrecovered_faults')} targets never served again; "
        f"leftovers after teardown: {sum((c.get('leaks') or {}).values())} ({HERE})."
    )
    overhead = c.get("gateway_overhead")
    if overhead:
        text += (
            f" The gateway added {overhead['added_p50_ms']:.1f} ms p50 per step (the p50 of the differences of "
            f"{overhead['rounds']} rounds, each one step straight to its host and one through the gateway on the "
            f"same replica, the order swapped every round; p50s {overhead['direct_p50_ms']:.1f} ms direct, "
            f"{overhead['gateway_p50_ms']:.1f} ms through the gateway; {HERE})."
        )
        key.append(["gateway overhead per step, p50", f"{overhead['added_p50_ms']:.1f} ms", HERE])
    key += [
        ["chaos: collateral aborts / lost / duplicated steps",
         f"{c.get('collateral_aborts')} / {c.get('lost_actions')} / {c.get('duplicated_actions')}", HERE],
    ]  # fmt: skip
    return Section(
        "Faults (osfleet bench chaos)",
        [Text(text), Table(["fault", "target", "mechanism", "injected", "recovered after", "layer"], rows)],
    )


def _infra(i: dict[str, Any], key: list[list[str]]) -> Section:
    """``infra.json`` of ``osfleet bench infra`` or of the main job (which adds the CLI, resources and the
    gateway over the deployed agents)."""
    leftovers = sum((i.get("leftovers") or {}).values())
    how = f"`pulumi up --stack {i['stack']}` (the plain CLI)" if i.get("cli") == "pulumi" else "`up`"
    resources = f" ({i['resources']} resources)" if i.get("resources") is not None else ""
    text = (
        f"{i.get('engine')}: {how} of {i.get('hosts')} lab hosts{resources} in {i.get('up_seconds')} s, "
        f"{i.get('hosts_healthy')} agents healthy, a second `up` in {i.get('second_up_seconds')} s with "
        f"{i.get('second_up_changes')} changes, `destroy` in {i.get('destroy_seconds')} s, {leftovers} leftovers "
        f"({HERE})."
    )
    blocks: list[Any] = [Text(text)]
    key.append(["pulumi up of the lab (real engine)", f"{i.get('up_seconds')} s", HERE])
    over = i.get("gateway_overhead")
    if over:
        blocks.append(
            Text(
                f"Fleet gateway over the deployed agents: a step takes {over['direct_p50_ms']:.1f} ms straight to "
                f"its host and {over['gateway_p50_ms']:.1f} ms through the gateway; the gateway adds "
                f"{over['added_p50_ms']:.1f} ms at p50 (p95 {over['added_p95_ms']:.1f} ms, "
                f"{over['rounds']} alternating rounds; {HERE})."
            )
        )
        key.append(["gateway overhead per step (p50)", f"{over['added_p50_ms']:.1f} ms", HERE])
    if i.get("teardown_problems"):
        blocks.append(Text("Teardown problems: " + "; ".join(i["teardown_problems"])))
    title = "Infrastructure as code (pulumi up, fleet gateway)" if i.get("cli") else "Infrastructure as code"
    return Section(title, blocks)


def _disk(disk: dict[str, Any], key: list[list[str]]) -> Section:
    strategies = {k: v for k, v in disk["strategies"].items() if v.get("available")}
    rows = [
        [
            name,
            seconds(s["seconds_per_replica_p50"]),
            seconds(s["seconds_per_replica_p95"]),
            human_bytes(s["allocated_bytes_total"]),
            f"{s['savings_vs_full_copies'] * 100:.1f}%",
            HERE,
        ]
        for name, s in strategies.items()
    ]
    header = ["strategy", "p50 / replica", "p95 / replica", "allocated total", "savings vs N full copies", "source"]
    section = Section(
        "Disk provisioning",
        [
            Text(f"{disk['replicas']} replicas of `{disk['image']}`; {caption(disk.get('machine', {}))}."),
            Table(header, rows),
        ],
    )
    if disk["strategies"]["full"].get("sampled"):
        section.blocks.append(Text(f"Full copy: {disk['strategies']['full']['note']}."))
    key += [
        ["overlay speed-up vs full copy", f"{disk['speedup_overlay_vs_full']:.0f}x", HERE],
        ["disk savings (overlay)", f"{disk['savings_overlay'] * 100:.1f}%", HERE],
    ]
    return section


def _boot(boot: dict[str, Any], run_dir: Path, key: list[list[str]]) -> Section:
    section = Section(
        "Boot",
        [
            Text(f"{caption(boot.get('machine', {}))}."),
            Text(
                f"Guest agent answered after {boot['agent_seconds']:.1f} s, desktop drawn after "
                f"{boot['desktop_seconds']:.1f} s ({HERE})."
            ),
        ],
    )
    if boot.get("screenshot") and (run_dir / str(boot["screenshot"])).exists():
        section.blocks.append(Image(str(boot["screenshot"]), "replica screenshot"))
    key.append(["cold boot to desktop", f"{boot['desktop_seconds']:.1f} s", HERE])
    return section


def _resets(r: dict[str, Any], key: list[list[str]]) -> Section:
    rows = [
        [
            mode,
            seconds(r[mode]["p50"]),
            seconds(r[mode]["p95"]),
            seconds(r[mode]["bringup_seconds"]["p50"]),
            human_bytes(r[mode]["rss_bytes_per_replica"]),
            HERE,
        ]
        for mode in ("cold", "snapshot")
    ]
    key += [
        [f"reset p50 / p95, {mode}", f"{seconds(r[mode]['p50'])} / {seconds(r[mode]['p95'])}", HERE]
        for mode in ("snapshot", "cold")
    ]
    key.append(["snapshot vs cold reset (p50)", f"{r['speedup_snapshot_vs_cold']:.1f}x", HERE])
    for name, d in r.get("latency", {}).items():
        key.append([name.removesuffix("_seconds").replace("_", " ") + " p50", seconds(d["p50"]), HERE])
    blocks: list[Block] = [
        Text(
            f"{r['replicas']} replicas, {r['resets_per_replica']} resets each per mode; "
            f"{caption(r.get('machine', {}))}. Between resets: {r['between_resets']}."
        ),
        Table(["mode", "reset p50", "reset p95", "bring-up p50", "RSS per replica", "source"], rows),
    ]
    stages = r["snapshot"].get("stages_p50_ms")
    if stages:
        blocks.append(Text("Where a snapshot reset's time goes (p50 of each stage, osfleet.measure.timing):"))
        blocks.append(Table(["stage", "p50", "source"], [[k, f"{v:.1f} ms", HERE] for k, v in stages.items()]))
    return Section("Resets", blocks)


def _forks(r: dict[str, Any], key: list[list[str]]) -> Section:
    """``osfleet bench fork``: children's bring-up, how long the parent stood still, the checks."""
    if "fork_p50_s" not in r:
        return Section("Forks", [Text(f"The fork bench failed before it measured: {r.get('failure')}")])
    key.append(["fork: child bring-up p50 / p95", f"{seconds(r['fork_p50_s'])} / {seconds(r['fork_p95_s'])}", HERE])
    key.append(["fork: parent paused", seconds(r["parent_paused_s"]), HERE])
    rows = [
        ["children ready", f"{r.get('children_ready')} of {r['children']}", HERE],
        ["child bring-up p50 / p95", f"{seconds(r['fork_p50_s'])} / {seconds(r['fork_p95_s'])}", HERE],
        ["parent paused / saved", f"{seconds(r['parent_paused_s'])} / {seconds(r['save_s'])}", HERE],
        ["first child / all children ready", f"{seconds(r['first_child_ready_s'])} / {seconds(r['total_s'])}", HERE],
        ["same state, diverged", f"{r.get('same_state')}, {r.get('diverged')}", HERE],
    ]
    return Section(
        "Forks",
        [
            Text(f"A replica forked {r['children']} ways mid-task; {caption(r.get('machine', {}))}."),
            Table(["figure", "value", "source"], rows),
        ],
    )


def _load_test(results: RunResults, key: list[list[str]]) -> Section:
    load = results.load
    section = Section("Load test (Locust)")
    if load.bringup:
        b = load.bringup[-1]
        total = b.get("all_ready_seconds")
        done = f", all after {total:.1f} s ({HERE})." if total else "."
        if b.get("error"):  # the request itself was refused (e.g. no room in the fleet)
            done = f": the request was refused ({b['error']})."
        section.blocks.append(
            Text(f"Bring-up: {b.get('ready', 0)}/{b.get('requested', '?')} replicas requested at once were ready{done}")
        )
        if total:
            key.append([f"bring-up of {b['requested']} replicas at once", f"{b['all_ready_seconds']:.1f} s", HERE])
    if load.trajectories:
        s = trajectory_summary(load.trajectories)
        section.blocks.append(
            Text(
                f"Trajectories: {s['scored']} scored ({s['successful']} successful, mean reward "
                f"{s['mean_reward']:.2f}), {s['aborted']} unscored aborts, {s['errors']} errors, "
                f"{s['interrupted']} cut short by the run's end; "
                f"{s['per_minute']:.1f} per minute ({HERE})."
            )
        )
        by_host = s["scored_by_host"]
        if len(by_host) > 1:  # through a fleet gateway, whose replica ids are "<host>.<replica>"
            counts = ", ".join(f"{h} {n}" for h, n in by_host.items())
            section.blocks.append(Text(f"Through the fleet gateway across {len(by_host)} hosts: {counts} scored."))
        across = f" across {len(by_host)} hosts" if len(by_host) > 1 else ""
        key += [
            [f"trajectories per minute{across}", f"{s['per_minute']:.1f}", HERE],
            ["unscored aborts", f"{s['abort_share'] * 100:.1f}%", HERE],
        ]
    for r in load.stats:
        if r.get("Name") in ("reset", "step", "evaluate"):
            p50, p95 = float(r["50%"]) / 1000, float(r["95%"]) / 1000
            key.append([f"API {r['Name']} p50 / p95", f"{p50:.2f} s / {p95:.2f} s", HERE])
    return section


CURVE_ROWS = 12  # points of the density curve shown as a table (the figure has them all)


def _density(d: dict[str, Any], key: list[list[str]]) -> Section:
    """``osfleet bench density``: how many ready desktops were held, what each cost in memory, the curve."""
    held, mib = d.get("held_ready"), d.get("mib_per_replica")
    text = f"{held} ready desktops held at once, each answering; stopped: {d.get('stop_reason')}"
    if mib:
        text += f"; {mib:.1f} MiB of host memory per desktop ({HERE})"
        key.append(["ready desktops held / MiB each", f"{held} / {mib:.1f} MiB", HERE])
    blocks: list[Block] = [Text(f"{text}; {caption(d.get('machine', {}))}.")]
    curve = d.get("memory_curve") or []
    if curve:
        step = max(1, -(-len(curve) // CURVE_ROWS))
        shown = curve[::step] + ([curve[-1]] if (len(curve) - 1) % step else [])
        columns = ["replicas"] + sorted(k for k in curve[0] if k != "replicas" and isinstance(curve[0][k], int | float))
        rows = [[_number(p.get(c)) for c in columns] for p in shown]
        blocks.append(Text("Host memory per desktop against the number held (the curve):"))
        blocks.append(Table([c.replace("_", " ") for c in columns], rows))
    return Section("Density", blocks)


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    return str(value) if isinstance(value, int) else f"{value:.1f}"


def _throughput(t: dict[str, Any], key: list[list[str]]) -> Section:
    """``osfleet bench throughput``: scored trajectories a minute through the gateway, where their time and the
    machine's CPU went."""
    if "trajectories_per_min" not in t:
        return Section("Throughput", [Text(f"The throughput bench failed before it measured: {t.get('failure')}")])
    key.append(["scored trajectories a minute (bench throughput)", f"{t['trajectories_per_min']:.1f}", HERE])
    blocks: list[Block] = [
        Text(
            f"{t['trajectories_per_min']:.1f} scored trajectories a minute ({t['scored']} in {t['minutes']:g} min, "
            f"{t.get('successful')} successful, {t['aborted']} aborted, {t.get('cut_at_end')} cut at the end) "
            f"through a fleet gateway over {t['hosts']} host agents with {t['warm_per_host']} warm replicas each, "
            f"{t['users']} oracle agents; {caption(t.get('machine', {}))} ({HERE})."
        )
    ]
    stages = t.get("stages") or {}
    rows = [[n, seconds(d["p50"]), seconds(d["p95"]), f"{d['share']:.0%}"] for n, d in stages.items() if "p50" in d]
    if rows:
        blocks.append(Text("Where an episode's time goes (the agents' clocks):"))
        blocks.append(Table(["stage", "p50", "p95", "share of the time"], rows))
    cpu = t.get("cpu") or {}
    per = cpu.get("per_trajectory_s") or {}
    if per:
        kinds = [k for k in per if k not in ("all",) and per[k]]
        blocks.append(
            Text(
                f"CPU per scored trajectory: {per['all']:.2f} core-seconds of the machine's in all "
                f"({cpu.get('cores_busy')} cores busy on average), by kind of process:"
            )
        )
        blocks.append(Table(["process", "core-seconds per trajectory"], [[k, f"{per[k]:.3f}"] for k in kinds]))
    return Section("Throughput", blocks)


def _cost(results: RunResults, key: list[list[str]]) -> Section:
    """Per priced host type: active replicas per host and their USD a day; parked ones (when the run measured a
    density); USD per 1,000 steps (when it measured steps under load)."""
    cost = results.cost
    if cost is None:
        raise ValueError("no cost in these results")
    source = "computed here from measured footprint + price table"
    parked = cost.parked_text is not None
    steps = cost.cpu_seconds_per_step is not None
    header = ["host type", "active replicas per host", "USD per active replica-day"]
    header += ["parked replicas per host", "USD per parked replica-day"] if parked else []
    header += ["USD per 1,000 steps"] if steps else []
    rows = []
    for c in cost.rows:
        row = [c["host"], f"{c['replicas_per_host']} ({c['binding_resource']})", _usd(c["usd_per_replica_day"])]
        if parked:
            row += [f"{c['parked_replicas_per_host']} ({c['parked_binding_resource']})"]
            row += [_usd(c["usd_per_parked_replica_day"])]
        if steps:
            row.append(_usd(c["usd_per_1000_steps"], 4))
        rows.append([*row, source])
    for label, figure, digits, binding, basis in (
        ("active replica-day", "usd_per_replica_day", 3, "binding_resource", "footprint"),
        ("parked replica-day", "usd_per_parked_replica_day", 4, "parked_binding_resource", "density"),
        ("1,000 steps", "usd_per_1000_steps", 4, None, "CPU per step"),
    ):
        priced = [c for c in cost.rows if c.get(figure) is not None]
        if priced:
            best = min(priced, key=lambda c: float(c[figure]))
            value = f"{best[figure]:.{digits}f} USD" + (f", binding {best[binding]}" if binding else "")
            key.append([f"cost per {label} ({best['host']})", value, f"{HERE} ({basis}) + price table"])
    version = f"version {cost.prices.get('version')}, read on {cost.prices.get('read_on')}"
    blocks: list[Block] = [Text(f"Footprint per active replica {HERE}: {cost.footprint_text}.")]
    if parked:
        blocks.append(Text(f"Footprint per parked replica {HERE}: {cost.parked_text}."))
    if steps:
        blocks.append(
            Text(
                f"CPU per step {HERE}: {cost.step_text}. A step is priced at the host's usable core-seconds; the "
                "guests ran under this machine's accelerator (TCG here: on a KVM host a guest's own work costs "
                "far less, so this is an upper bound there)."
            )
        )
    blocks += [
        Text(f"Prices from the price table osfleet ships (`{PRICES_NAME}`, {version}; each with its source)."),
        Table([*header, "source"], rows),
    ]
    return Section("Cost", blocks)


def _usd(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _comparison(results: RunResults) -> list[list[str]]:
    def here(value: str | None) -> str:
        return f"{value} ({HERE})" if value else "not measured in this run"

    disk, resets, traj = results.disk, results.resets, results.load.trajectories
    s = trajectory_summary(traj) if traj else None
    saving = f"{disk['savings_overlay'] * 100:.1f}%" if disk else None
    speedup = f"{disk['speedup_overlay_vs_full']:.0f}x" if disk else None
    reset = f"{seconds(resets['snapshot']['p50'])} (snapshot)" if resets else None
    per_min = f"{s['per_minute']:.1f} on this 2-core host" if s else None
    aborts = f"{s['abort_share'] * 100:.1f}%" if s else None
    return [
        ["disk saving vs full copies", here(saving), "88% (published)", "-"],
        ["provisioning speed-up vs full copy", here(speedup), "37x (published)", "-"],
        ["reset p50", here(reset), "cold boot per reset (published code)", "37.2 s (published)"],
        ["trajectories per minute", here(per_min), "1420 at 1024 replicas (published)", "-"],
        ["unscored aborts", here(aborts), "-", "1.9% (published)"],
    ]


def _inline(text: str) -> Markup:
    """HTML for one line of the report's Markdown subset: escaped text, `code` spans."""
    parts = str(escape(text)).split("`")
    return Markup("".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts)))


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("osfleet.report", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["inline"] = _inline
    return env
