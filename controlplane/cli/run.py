"""edgectl's main(): parse the command line, run one command, and turn whatever it raised
into one line on stderr (`edgectl: <what>`) and an exit code (exits.py); a traceback only
with --debug. A reader that goes away (`edgectl status | head -1`) ends the command quietly."""

from __future__ import annotations

import os
import sys

from controlplane.cli import exits
from controlplane.cli.output import PROG
from controlplane.cli.parser import build_parser
from controlplane.errors import say


def _reader_gone() -> int:
    """stdout's reader closed the pipe: nothing more to say, and nothing left to flush."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return exits.OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return exits.INTERRUPTED
    except Exception as e:  # every failure is one line; which exit code says what kind it was
        code, line = exits.classify(e)
        say(PROG, line, args.debug)
        return code


if __name__ == "__main__":
    sys.exit(main())
