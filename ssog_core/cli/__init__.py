"""Every command line: ``main(argv)`` per command. ``python -m ssog_core <command>``, ``python -m ssog_core.train``
(what checkpoints record) and the ``ssog-*`` console scripts all call these."""
