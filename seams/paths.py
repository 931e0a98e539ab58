"""Where the checkout is: the one copy of the repository root (``REPO_ROOT``), which site
names are made relative to and which the reports' source digest and snippets read."""
from __future__ import annotations

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
