"""The host agent's HTTP API: osfleet's lease/reset/step/evaluate contract and OSGym's endpoints."""
