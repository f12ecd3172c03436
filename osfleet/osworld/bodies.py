"""Request bodies as OSWorld's controllers send them: a JSON object, an URL-encoded form, a multipart form.

Each is parsed with the standard library (``json``, ``urllib.parse``, ``email``), from a body the server has
already read whole within the endpoint's byte limit (``server``). The multipart parser is ``email``'s: it keeps
binary parts byte for byte, but it holds about ten times the body in memory while it works (measured: a 20 MiB
upload peaked at 213 MiB and took 0.9 s), which is why uploads are capped at ``MAX_UPLOAD_BYTES``, the fleet's own
default body limit. A larger cap wants a streaming parser, measured against this one.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from osfleet.osworld.errors import BadRequest, UnsupportedMediaType

MAX_JSON_BYTES = 2 * 2**20  # a command, a script, a window name: OSWorld never sends more
MAX_UPLOAD_BYTES = 16 * 2**20  # a set-up file (the fleet's default --max-body-mib; see the module's docstring)
MAX_FIELDS = 32  # form fields or multipart parts in one request


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def json_object(body: bytes, content_type: str) -> dict[str, Any]:
    """The JSON object of a request (Flask's ``request.json``: 415 unless the body says it is JSON)."""
    if not media_type(content_type).endswith("json"):
        raise UnsupportedMediaType(f"expected a JSON body (Content-Type: application/json), not {content_type!r}")
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"expected a JSON object, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Form:
    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)


def form(body: bytes, content_type: str) -> Form:
    """A form, URL-encoded (``requests.post(data={...})``) or multipart (``MultipartEncoder``); the first value
    of a field given twice, as Flask's ``request.form[...]`` reads it."""
    kind = media_type(content_type)
    if kind == "application/x-www-form-urlencoded" or (kind == "" and not body):
        try:
            pairs = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=MAX_FIELDS)
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadRequest(f"the form cannot be read: {exc}") from None
        return Form({k: v[0] for k, v in pairs.items()})
    if kind == "multipart/form-data":
        return _multipart(body, content_type)
    raise BadRequest(f"expected a form (URL-encoded or multipart), not {content_type!r}")


def _multipart(body: bytes, content_type: str) -> Form:
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode(errors="replace")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart() or message.defects:
        raise BadRequest("the multipart form cannot be read (no boundary, or a broken one)")
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for i, part in enumerate(message.iter_parts()):
        if i >= MAX_FIELDS:
            raise BadRequest(f"more than {MAX_FIELDS} parts in one form")
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise BadRequest("a multipart part without a name")
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes):
            raise BadRequest(f"multipart part {name!r} has no content")
        if part.get_filename() is not None:
            files.setdefault(name, data)
            continue
        try:
            fields.setdefault(name, data.decode())
        except UnicodeDecodeError:
            raise BadRequest(f"multipart field {name!r} is not UTF-8 text") from None
    return Form(fields, files)
