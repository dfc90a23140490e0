"""The models: SSOG / dot / RBF attention modules, the ViT, the causal language model, SuSiE positions, the ViT's
config and its cost (parameters, FLOPs). Built on :mod:`ssog_core.field` and :mod:`ssog_core.ops`."""
