"""A launcher for ``fanin run`` (run as a script, arguments as ``fanin``'s) whose files may
not grow beyond ``FANIN_TEST_FILE_LIMIT`` bytes (``ulimit -f``): a write beyond it fails with
EFBIG, as on a full disk (Python ignores SIGXFSZ)."""

from __future__ import annotations

import os
import resource
import sys

from fanin.cli import main

if __name__ == "__main__":
    limit = int(os.environ["FANIN_TEST_FILE_LIMIT"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    sys.exit(main())
