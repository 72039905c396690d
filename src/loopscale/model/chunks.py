"""Row chunks of the model's fused kernels (``model/loss.py``, ``model/fused.py``): how many rows each pass takes.

The model owns these sizes; ``loopscale.memory`` reads them to predict the chunks' temporaries. Torch-free, so
the memory model (and ``sweep plan``, which imports it) stays light.
"""

from __future__ import annotations

LOSS_CHUNK_BYTES = 2**28  # fp32 logits of one chunk of the fused loss (and their softmax): 256 MiB each
MLP_CHUNK_BYTES = 2**20  # one row chunk's fp32 hidden activation in model/fused.py's MLP (cache-sized)


def chunk_rows(vocab: int, rows: int) -> int:
    """Rows per chunk of the fused loss: all of them when the logits are small (CPU vocabularies)."""
    return max(1, min(rows, LOSS_CHUNK_BYTES // (4 * vocab)))


def mlp_chunk_rows(hidden: int) -> int:
    """Rows per chunk of model/fused.py's MLP: its [rows, hidden] fp32 activation ~``MLP_CHUNK_BYTES``, so
    that it stays in cache while the square, the second matmul and their gradients read it."""
    return max(64, MLP_CHUNK_BYTES // (4 * hidden))
