"""edgectl: the operator's CLI (`edgectl --help`, `edgectl COMMAND --help`).

This package owns the command line only; what a command does lives in the modules it calls.
    run.py       main(): parse, run one command, turn what it raised into one line and an exit code
    exits.py     the exit codes and which error gets which (pure)
    parser.py    the argparse definitions (the shell completion is generated from them)
    nodeconf.py  which config the node runs (--config, EDGE_CONFIG, /etc/edge/edge.yaml) and
                 the pin_dir and api_socket it names
    local.py     commands that work on this host without edged: validate, diff, deploy,
                 undeploy, status, conntrack
    served.py    commands edged serves over its API: drain, undrain, drain-node, weight,
                 reload, events
    extra.py     fleet status, the failover drill, shell completion
    output.py    printing: text or --json, one convention for every command
"""

from controlplane.cli.parser import build_parser
from controlplane.cli.run import main

__all__ = ["build_parser", "main"]
