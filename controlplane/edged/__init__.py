"""edged, the daemon of one edge node, as one package: the daemon and its parts.

daemon.py      Daemon: builds the State and the parts below, deploys or adopts the data
               path, runs and stops their loops, watches the data path
state.py       State: what the parts share (config, maps, services, marks, locks, events,
               announcer and fleet member or None); Steered: one service as edged drives it
steer.py       Steering: probes in (the Prober, on its own thread), one decision per service, weights out
status.py      Status: the status views (snapshot, backend_view, node_state) and the
               edge_be_probe record
operations.py  Operations: operator actions (drain, weight pins, drain-node)
changes.py     Changes: reloads and discovery's changes applied to the maps, drain-out
events.py      the event log and its journald/JSON lines
watch.py       checks that the deployed data path is still in place, and repairs it
sdnotify.py    systemd's notify socket and watchdog
metrics.py     the Prometheus collector over the BPF maps
announce.py    when a VIP is announced over BGP; bird.py writes and drives BIRD
cli.py         the `edged` command line: serve() and main()
"""

from controlplane.edged.daemon import Daemon
from controlplane.edged.events import Events
from controlplane.edged.state import Steered

__all__ = ["Daemon", "Events", "Steered"]
