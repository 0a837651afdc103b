"""v2 file features (issue 14 item 7): uploads, UDP downloads, offers."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # for rdt_receiver, v2files_testlib
