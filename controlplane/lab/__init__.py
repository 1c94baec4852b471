"""The lab: network-namespace testbeds that the tests, the drill, the demo and
the benchmarks share: topology (topo), backend server (backend), simulated
inference server (inference), client traffic (traffic), the router driven through
edgectl (router), edged as a process (daemon) and heartbeat agents (heartbeats).

Used by netns-tests/, the demo and the benchmarks. Kept import-light on purpose:
`python -m controlplane.lab.backend` starts once per backend namespace.
"""
