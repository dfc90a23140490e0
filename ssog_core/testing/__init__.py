"""Test tooling shared by the tests, the benchmarks and the docs scripts: the float64 oracles
(:mod:`~ssog_core.testing.oracles`) and the app's real command line in a subprocess
(:mod:`~ssog_core.testing.app_process`). Nothing in SSOG Lab's code imports it."""
