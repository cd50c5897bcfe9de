"""Which SGLang release the simulator plays: its own module, so that a worker learns it
without importing the argument parser."""

from __future__ import annotations

import os

DEFAULT_VERSION = "0.5.23"
VERSION = os.environ.get("SGLANG_SIM_VERSION") or DEFAULT_VERSION
