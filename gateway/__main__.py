"""``python -m gateway`` is the ``sweetspot`` command."""

from gateway.cli import main

main()
