"""Subcommands of the ``minicb`` command line, one module each."""
