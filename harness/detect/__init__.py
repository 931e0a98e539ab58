"""Layer 2: the happens-before race detector over runtime traces."""
from .hb import AccessInfo, Race, detect

__all__ = ["AccessInfo", "Race", "detect"]
