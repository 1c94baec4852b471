"""edged, the daemon of one edge node, as one package: the daemon and its parts.

    daemon.py      Daemon: the asyncio orchestration (deploy or adopt, probe, steer, status)
    changes.py     reloads and discovery changes applied to the maps
    operations.py  operator actions (drain, weight pins, status walks)
    events.py      the event log and its journald/JSON lines
    watch.py       checks that the deployed data path is still in place, and repairs it
    sdnotify.py    systemd's notify socket and watchdog
    metrics.py     the Prometheus collector over the BPF maps
    announce.py    when a VIP is announced over BGP; bird.py writes and drives BIRD
    cli.py         the `edged` command line: serve() and main()
"""

from controlplane.edged.daemon import Daemon, Steered
from controlplane.edged.events import Events

__all__ = ["Daemon", "Events", "Steered"]
