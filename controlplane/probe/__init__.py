"""The probe engine's parts (being moved here from controlplane/prober.py)."""
