"""``python -m osfleet`` is the ``osfleet`` command."""

from osfleet.cli import main

main()
