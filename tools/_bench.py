"""What every tools/bench-* script does before its imports: run under the repository's venv and
import this checkout (not an installed copy). Standard library only: the calling python may be
any python3. Usage, first thing in a script: `from _bench import use_venv; use_venv("bcc")`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
VENV_PYTHON = TOP / ".venv" / "bin" / "python"
REEXEC_ENV = "EDGE_BENCH_REEXEC"


def use_venv(needs: str) -> None:
    """Start the calling script again under the repo's venv when module `needs` is not importable here.

    The venv sees Debian's bcc (tools/bootstrap). find_spec looks without importing. Exits with one
    line when there is no venv; then puts the checkout first on sys.path.
    """
    script = Path(sys.argv[0]).resolve()
    if importlib.util.find_spec(needs) is None and not os.environ.get(REEXEC_ENV):
        if VENV_PYTHON.exists():
            os.environ[REEXEC_ENV] = "1"
            os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), str(script), *sys.argv[1:]])
        sys.exit(f"{script.name}: {needs} is not importable and {VENV_PYTHON} is missing; run tools/bootstrap")
    sys.path.insert(0, str(TOP))
