"""The host agent's routes, one module per resource; ``osfleet.api.app`` joins them with their shared auth."""
