"""A simulated inference server (vLLM's OpenAI API, KServe v2 health) for the demo, tests and
benchmarks: completions with a bounded number of running requests, a FIFO queue, a fixed
time-to-first-token and time-per-output-token, Prometheus metrics named like vLLM's, and knobs
that degrade it while it runs (POST /sim/degrade). Knows nothing of the router. Stdlib asyncio
only.

    python -m controlplane.lab.inference --name b0 --listen 198.18.1.2:8000 --max-running 4
    curl -d '{"hang": true}' http://198.18.1.2:8000/sim/degrade

options (options and knobs, pure), engine (the model: Engine's docstring), page (the one fake
vLLM metrics page), server (HTTP, the heartbeat child, run_in_thread), cli (the command line
and degrade_from).
"""

from controlplane.lab.inference.cli import degrade_from, main, options, parser
from controlplane.lab.inference.engine import Engine
from controlplane.lab.inference.options import KnobError, Knobs, Options, UsageError, heartbeat_command
from controlplane.lab.inference.page import EngineStats, vllm_page
from controlplane.lab.inference.server import Handle, Server, run_in_thread, serve

__all__ = [
    "Engine",
    "EngineStats",
    "Handle",
    "KnobError",
    "Knobs",
    "Options",
    "Server",
    "UsageError",
    "degrade_from",
    "heartbeat_command",
    "main",
    "options",
    "parser",
    "run_in_thread",
    "serve",
    "vllm_page",
]
