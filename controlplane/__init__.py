"""Edge router control plane: config, Maglev tables, loader and maps, deploy, edged, the edgectl CLI and its drills."""

__version__ = "0.1.0"
