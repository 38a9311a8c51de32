"""Test helper process: serve a real AEDAT4 recording through dv-processing's own
``NetworkWriter`` on loopback, as a DV camera stream would arrive.

``python -m tests.support.dv_net_writer FILE PORT START_US``: writes the events from
``START_US`` on in 5 ms packets at about real time once a client has connected, then
idles until killed. Prints
``ready`` once listening.
"""

from __future__ import annotations

import sys
import time

import dv_processing as dv


def main() -> None:
    path, port, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rec = dv.io.MonoCameraRecording(path)
    stream = dv.io.Stream.EventStream(0, "events", "DVXplorer_TEST", rec.getEventResolution())
    writer = dv.io.NetworkWriter("127.0.0.1", port, stream)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while writer.getClientCount() == 0:  # packets sent to nobody would be lost
        time.sleep(0.01)
    end = rec.getTimeRange()[1]
    t = start
    while t < end:
        batch = rec.getEventsTimeRange(t, t + 5000)
        if batch is not None and batch.size() > 0:
            writer.writeEvents(batch)
        t += 5000
        time.sleep(0.005)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
