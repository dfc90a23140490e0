"""SSOG Lab's Gradio app (``python -m app``): a thin layer over :mod:`ssog_core`."""

import os

# Set before any module of the app imports Gradio. Air-gapped by default: no telemetry calls. Gradio's queue keeps
# a record of the last N events and rebuilds a pandas summary of them after every event (for its monitoring page):
# 10000 by default, which costs memory and CPU that grow with the server's age.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "500")
