"""The models: the one ViT (the lab's models and every standard ViT) with its attention parts (SSOG, dot, RBF), the
causal language model, SuSiE positions, the ViT's config with each family's conventions, the protocol every model
the lab opens offers, and the ViT's cost (parameters, FLOPs). Built on :mod:`ssog_core.field` and
:mod:`ssog_core.ops`."""
