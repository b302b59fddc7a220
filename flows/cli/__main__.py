"""``python -m prmloop.flows.cli``: the same as the ``prmloop`` command."""

from prmloop.flows.cli import main

main()
