"""``osfleet cua serve``: a leased osfleet desktop as Cua's computer-server, for ``cua-computer`` and ``cua-agent``."""
