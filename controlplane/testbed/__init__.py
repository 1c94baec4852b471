"""Network-namespace testbed: topology (topo), backend server (backend), simulated
inference server (inference), client traffic (traffic).

Used by netns-tests/, the demo and the benchmarks. Kept import-light on purpose:
`python -m controlplane.testbed.backend` starts once per backend namespace.
"""
