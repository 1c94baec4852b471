"""python -m controlplane: the same as edgectl."""

from controlplane.cli import main

raise SystemExit(main())
