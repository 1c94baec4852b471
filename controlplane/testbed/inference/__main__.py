"""python -m controlplane.testbed.inference: the simulated inference server (sim-inference)."""

from controlplane.testbed.inference.cli import main

raise SystemExit(main())
