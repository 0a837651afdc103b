"""End-to-end tests: the real server, agent, tools and memory over real loopback TCP."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # for e2e_testlib
