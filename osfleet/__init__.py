"""osfleet: fleets of copy-on-write desktop VM replicas for computer-use agents."""

__version__ = "0.1.0"
