"""``python -m easd_local.cli``: the same as the ``easd-local`` script."""

from easd_local.__main__ import main

main()
