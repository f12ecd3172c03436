"""Recorded episodes as one file: JSONL (one line per step, the episode's summary on each) or Parquet.

Each row is a step with its episode's fields (``episode_*``) and its observation inline (``image``: base64 in
JSONL, bytes in Parquet), so a training job reads one file and needs nothing else. An episode with no steps
is one row with empty step fields, so it is not lost from the export.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from osfleet.errors import OsfleetError
from osfleet.recording.store import TrajectoryStore

ExportFormat = Literal["jsonl", "parquet"]


def rows(store: TrajectoryStore, ids: list[str]) -> Iterator[dict[str, Any]]:
    for tid in ids:
        meta = store.meta(tid)
        head = {f"episode_{k}": v for k, v in meta.model_dump(mode="json").items() if k != "bytes"}
        steps = store.steps(tid)
        if not steps:
            yield {**head, "step": None}
        for s in steps:
            image = store.image_path(tid, s.image).read_bytes() if s.image else None
            yield {
                **head,
                "step": s.index,
                "action_id": s.action_id,
                "time": s.time,
                "seconds": s.seconds,
                "actions": s.actions,
                "results": s.results,
                "done": s.done,
                "metadata": s.metadata,
                "source": s.source,
                "image_format": meta.image_format if image else None,
                "image": image,
                "width": s.width,
                "height": s.height,
            }


def export(store: TrajectoryStore, ids: list[str], fmt: ExportFormat, out: Path) -> int:
    """Write ``ids`` to ``out``; returns the number of rows."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        n = 0
        with open(out, "w") as f:
            for row in rows(store, ids):
                if row.get("image") is not None:
                    row["image"] = base64.b64encode(row["image"]).decode()
                f.write(json.dumps(row) + "\n")
                n += 1
        return n
    return _parquet(store, ids, out)


# Nested free-form fields (task, actions, results, metadata) are JSON text in Parquet: their shape differs
# from row to row, which Arrow's nested types cannot hold in one column.
_JSON_COLUMNS = ("episode_task", "actions", "results", "metadata")


def _parquet(store: TrajectoryStore, ids: list[str], out: Path) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise OsfleetError("Parquet export needs pyarrow: pip install 'osfleet[parquet]'") from None
    table_rows = []
    for row in rows(store, ids):
        for key in _JSON_COLUMNS:
            if row.get(key) is not None:
                row[key] = json.dumps(row[key])
        table_rows.append(row)
    schema = _schema(pa)
    table = pa.Table.from_pylist(table_rows, schema=schema)
    pq.write_table(table, out)
    return table.num_rows


def _schema(pa: Any) -> Any:
    s, f, i, b = pa.string(), pa.float64(), pa.int64(), pa.bool_()
    return pa.schema(
        [
            ("episode_id", s),
            ("episode_replica_id", s),
            ("episode_lease_id", s),
            ("episode_holder", s),
            ("episode_host", s),
            ("episode_task_id", s),
            ("episode_instruction", s),
            ("episode_task", s),
            ("episode_started_at", f),
            ("episode_ended_at", f),
            ("episode_ended_by", s),
            ("episode_end_reason", s),
            ("episode_error", s),
            ("episode_reward", f),
            ("episode_success", b),
            ("episode_steps", i),
            ("episode_image_format", s),
            ("episode_image_quality", i),
            ("episode_reset_image", s),
            ("step", i),
            ("action_id", s),
            ("time", f),
            ("seconds", f),
            ("actions", s),
            ("results", s),
            ("done", b),
            ("metadata", s),
            ("source", s),
            ("image_format", s),
            ("image", pa.binary()),
            ("width", i),
            ("height", i),
        ]
    )
