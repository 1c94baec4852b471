"""python -m controlplane.agent: the same as edge-heartbeat."""

from controlplane.agent.sender import main

raise SystemExit(main())
