"""osfleet's Pulumi program: everything lives in the importable package ``osfleet_infra`` next to this file."""

from osfleet_infra.program import run

run()
