"""Every command line: ``main(argv)`` per command. ``python -m ssog_core.<name>`` (what checkpoints record) and the
``ssog-*`` console scripts both call these."""
