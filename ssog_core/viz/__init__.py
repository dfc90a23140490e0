"""Pictures: raster and encoding helpers (:mod:`~ssog_core.viz.raster`), the matplotlib figures of each app tab
(:mod:`~ssog_core.viz.figures`) and the figure files the app and the CLI write (:mod:`~ssog_core.viz.files`)."""
