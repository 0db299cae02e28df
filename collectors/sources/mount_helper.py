"""The mount helper process: `python -m fleetwatch.collectors.sources.mount_helper`.

Serves `mount_calls` requests from stdin until it closes (the exporter stopped or died), then
exits at once: a call still stuck in the kernel on a hung mount is abandoned with the
process, which the kernel ends when that call returns. Nothing imports this module; it is
only the helper's entry point.
"""

from __future__ import annotations

import os
import sys

from fleetwatch.collectors.sources.mount_calls import serve

if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
    os._exit(0)  # daemon workers stuck in the kernel are abandoned, not waited for
