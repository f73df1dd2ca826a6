"""Manual poking: `python -m warmroute_harness` starts the default fleet until Enter is pressed
(logs in $LOGDIR, or a fresh temporary folder)."""

import os
import tempfile
from pathlib import Path

from .fleet import Fleet

with Fleet(logdir=Path(os.environ.get("LOGDIR", tempfile.mkdtemp()))) as f:
    print("envoy on", f.envoy.port, "admin", f.envoy.admin_port, "logs", f.logdir)
    input("enter to stop")
