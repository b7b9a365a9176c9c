"""Command-line argument groups that more than one command shares, and what they build (argparse lives here and
in ``cli/``, never in the library below).

It sits above the library (runtime, export, serving) and below the commands that use it: ``cli/`` and ``bench/``
(a benchmark builds on the library and these groups, never on the CLI).

    decoding    the models / requests / output groups of ``dspark generate`` and ``dspark bench e2e``, the
                decoder they select, the requests they send and the ``generate`` options they give
"""
