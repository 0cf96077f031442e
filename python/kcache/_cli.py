"""The `kcache` command of the Python package: the C++ tool bundled in the
package (kcache/_bin/kcache), started in place of this process with the same
arguments, so that it behaves (output, exit status, signals) exactly as the
tool does."""

from __future__ import annotations

import os
import sys


def tool_path() -> str:
    """Where the bundled tool is."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "kcache")


def main() -> None:
    path = tool_path()
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"kcache: the command-line tool is not in this installation of the package ({path} is "
                         "missing); reinstall it with pip install kcache-jit.\n")
        sys.exit(127)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, ["kcache", *sys.argv[1:]])


if __name__ == "__main__":
    main()
