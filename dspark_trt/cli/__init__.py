"""Thin argparse layers over the library: each subcommand module has ``add_parser`` and ``run``."""
