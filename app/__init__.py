"""SSOG Lab's Gradio app (``python -m app``): a thin layer over :mod:`ssog_core`."""
