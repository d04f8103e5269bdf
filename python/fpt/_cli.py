"""The fpt command of an installed wheel: runs the fpt binary the wheel
carries (fpt -h), so that `fpt run`, `fpt bench` and the scheduler and
server roles need no build tree."""

import os
import sys

from . import _lib


def main():
    path = os.environ.get("FPT_BIN") or _lib.native("fpt")
    if not path:
        sys.exit("fpt: this package carries no fpt binary (a source tree: run scripts/build.sh and use bin/fpt)")
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
