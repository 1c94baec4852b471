"""How edgectl prints: text for people, or with --json one JSON document on stdout for
scripts, the same for every command (objects, times in seconds, sizes in bytes); progress
and errors go to stderr, so stdout stays parseable."""

from __future__ import annotations

import json
import sys
from typing import Callable

PROG = "edgectl"


def progress(args) -> Callable[[str], None]:
    """A progress printer for long commands (deploy, undeploy, drill); silent with -q or --json."""

    def say(line: str) -> None:
        if not (args.quiet or getattr(args, "json", False)):
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    return say


def emit(args, data: object, text: str | Callable[[], None]) -> int:
    """data as JSON with --json, else text (a line, or a function that prints); returns 0."""
    if getattr(args, "json", False):
        json.dump(data, sys.stdout, indent=2, default=str)
        print()
    elif callable(text):
        text()
    else:
        print(text)
    return 0
