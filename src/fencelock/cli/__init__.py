"""The ``fencelock`` command (also ``python -m fencelock``): a thin shell over the public API.

One module per subcommand: :mod:`.run`, :mod:`.elect`, :mod:`.status` (``status`` and
``release``), :mod:`.top`, :mod:`.demo`, :mod:`.bench`, :mod:`.doctor` and the :mod:`.chaos`
package, each with its machinery beside it; :mod:`.main` parses and dispatches, :mod:`.common`
holds the exit codes and what every subcommand shares. Nothing of the library imports this wing.

``main(argv) -> int`` parses the command line and maps exceptions to exit codes through one
table (:data:`EXIT_CODES`). Subcommands: ``run`` (a distributed ``flock(1)``), ``elect`` (run a
command while elected leader), ``status``, ``release``, and the lazily imported ``demo``,
``chaos``, ``bench`` and ``doctor``.

Exit codes (``sysexits.h`` where one fits):

- 0 success; for ``run`` and ``elect``: the child's own code (128 + N when it died of signal N);
- 64 usage error (bad flag, bad value, malformed URL); 69 servers unavailable;
- 72 the lease (``elect``: leadership) was lost while the command ran (or was not held by the
  token given); the command's whole process group is signalled;
- 75 not acquired in time (``run --conflict-exit-code`` changes it).

Servers: repeated ``--server URL``, else ``$FENCELOCK_SERVERS`` (comma-separated), else
``redis://127.0.0.1:6379/0`` for ``run``, ``status``, ``release`` and ``doctor`` (``bench``
starts an embedded server instead). No password from a URL is ever printed or logged.
"""

from __future__ import annotations

from .common import EXIT_CODES, exit_code_for
from .main import build_parser, console_main, main

__all__ = ["EXIT_CODES", "build_parser", "console_main", "exit_code_for", "main"]
