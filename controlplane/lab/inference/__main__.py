"""python -m controlplane.lab.inference: the simulated inference server (sim-inference)."""

from controlplane.lab.inference.cli import main

raise SystemExit(main())
