"""Export trained runs to other ecosystems (``loopscale export``): a Hugging Face folder for now."""

from loopscale.export.hf import export_hf

__all__ = ["export_hf"]
