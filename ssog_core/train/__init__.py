"""Training: the ViT's training loop and what it is made of (config, processes, optimiser and schedule, resume
state), accuracy and resolution transfer, and the language model's loop. ``python -m ssog_core.train`` runs
:mod:`ssog_core.cli.train`."""
