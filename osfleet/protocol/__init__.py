"""The contract of osfleet's HTTP API as typed models, shared by the host agent, the gateway and the client.

Why a package of its own: a trainer's machine installs the client alone (no libvirt, FastAPI, Fabric), so what
the client and the servers must agree on lives where it imports with pydantic and nothing else. The host agent
publishes these models in its OpenAPI, the gateway serves the same operations, and the client parses answers
with them, so a field cannot mean one thing on one side and another on the other.

- ``actions``: what a step may ask a desktop to do (a discriminated union, validated before anything runs);
- ``tasks``: osfleet's task format and an evaluation's result;
- ``models``: request and response bodies of ``/v1`` (leases, replicas, reset, step, observe, fork);
- ``errors``: the error body and the one table of error kinds and HTTP statuses both sides read;
- ``wire``: JSON value types (integral floats as integers).

Nothing here may import from the rest of osfleet (a test imports this package with the server's modules
blocked).
"""
