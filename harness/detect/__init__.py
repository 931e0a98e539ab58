"""Layer 2: the happens-before race detector over runtime traces."""
from harness.detect.hb import AccessInfo, HBDetector, Race, ReplayedAccess, detect

__all__ = ["AccessInfo", "HBDetector", "Race", "ReplayedAccess", "detect"]
