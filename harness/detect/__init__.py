"""Layer 2: the happens-before race detector over runtime traces."""
from .hb import AccessInfo, HBDetector, Race, detect

__all__ = ["AccessInfo", "HBDetector", "Race", "detect"]
