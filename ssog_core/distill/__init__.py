"""Distillation: an SSOG student from any dot-attention ViT (docs/DESIGN.md §2.5). :mod:`.student` builds it from
the teacher and each head's atom fit, :mod:`.loop` trains it against the teacher's logits, :mod:`.report` says per head
how much of the teacher geometry alone and geometry with steering explain (``python -m ssog_core distill``)."""
