"""Edge router control plane: config, Maglev tables, maps and the edgectl CLI."""

__version__ = "0.1.0"
