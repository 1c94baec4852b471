"""edge-heartbeat: the agent beside an inference server. It sends the router UDP heartbeats
every --interval-ms while the server's own health check passes, and none while it fails.
Knows nothing of the router's maps or config files.

    edge-heartbeat --router 198.18.1.1 --source 198.18.1.2 --service-port 8000 \\
        --token-file /etc/edge/token --interval-ms 1 --check-url http://198.18.1.2:8000/health

Two processes sharing one page: the sender wakes on absolute deadlines (no drift; late ticks
are skipped, never bunched) and never waits for the checker, which probes the server over a
keep-alive connection and, between probes, watches it, so a server that dies is noticed when
the kernel closes its sockets. A checker whose results stop coming stops the sending too.
Runs until SIGTERM or SIGINT (exit 0) or --duration-s; errors: one line, exit 1 or 2.

options (command line, pure), schedule (deadlines), checks (the health checks), checker
(the checker process and the page it shares), wire (the heartbeat packets), sender (the send
loop and main).
"""

from controlplane.agent.checker import Checker, CheckerGone, CheckerProcess, Gate, Readiness, start_checker
from controlplane.agent.checks import Check, HttpCheck, NoCheck, Result, TcpCheck, make_check
from controlplane.agent.options import (
    DEFAULT_CHECK_PATH,
    DEFAULT_INTERVAL_MS,
    DEFAULT_ROUTER_PORT,
    PROG,
    Options,
    Target,
    UsageError,
    options,
    parse_check_url,
    parse_ms,
    parse_router,
    parse_token,
    parser,
    read_token_file,
)
from controlplane.agent.schedule import MAX_NAP_S, StopFlag, Ticker, sleep_until
from controlplane.agent.sender import SendStats, main, run, send_loop
from controlplane.agent.wire import Beats

__all__ = [
    "Beats",
    "Check",
    "Checker",
    "CheckerGone",
    "CheckerProcess",
    "DEFAULT_CHECK_PATH",
    "DEFAULT_INTERVAL_MS",
    "DEFAULT_ROUTER_PORT",
    "Gate",
    "HttpCheck",
    "MAX_NAP_S",
    "NoCheck",
    "Options",
    "PROG",
    "Readiness",
    "Result",
    "SendStats",
    "StopFlag",
    "Target",
    "TcpCheck",
    "Ticker",
    "UsageError",
    "main",
    "make_check",
    "options",
    "parse_check_url",
    "parse_ms",
    "parse_router",
    "parse_token",
    "parser",
    "read_token_file",
    "run",
    "send_loop",
    "sleep_until",
    "start_checker",
]
