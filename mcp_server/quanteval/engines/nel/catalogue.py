"""Moved to quanteval.engines.catalogue (issue 39: the catalogue is both engines' knowledge). This re-export is kept
only for evalserver/nel.py's `from quanteval.engines.nel.catalogue import catalogue`, a file being moved by another
change; point that import at quanteval.engines.catalogue and delete this module."""

from quanteval.engines.catalogue import catalogue

__all__ = ["catalogue"]
