"""BOS-aligned best-fit packing of documents into training rows of ``T + 1`` tokens.

The rows are the token stream a run trains on: ``inputs = row[:-1]``, ``targets = row[1:]``. They
depend only on the documents, the tokenizer, ``seq_len`` (T) and the seed — never on the model —
so every architecture in a sweep sees exactly the same tokens, and a run with budget D reads the
first ``D / T`` rows.

Algorithm (modded-nanogpt / nanochat style, chosen to minimise cropping *without any padding*):

1. every document becomes ``[BOS] + tokens``; a document longer than a row is split into full
   rows of ``T + 1`` tokens plus a remainder, and every continuation piece gets its own BOS, so
   it too begins a row-like unit ("BOS = start of a document or of a continuation");
2. rows are filled from a buffer of the next ``buffer`` pieces (in stream order): at each step
   the *largest* piece that fits the space left is placed (best fit, so full-row pieces fill
   empty rows and long pieces go first, i.e. best-fit decreasing within the buffer);
3. when no piece fits, the *shortest* piece is cropped to fill the row exactly; its cropped tail
   returns to the buffer as a new BOS-led piece. Nothing is discarded and nothing is padded:
   every position of every row is a real token, so tokens trained = rows x T exactly. The only
   cost is an extra BOS per crop (reported by ``pack_stats``);
4. the last, incomplete row is dropped; then rows are shuffled with ``seed`` so that any prefix of
   rows is a uniform sample of the whole mixture.

Every row therefore starts with BOS; a row is never padded.
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loopscale.data.tokenizer import Tokenizer


@dataclass(frozen=True)
class PackStats:
    """What packing did: rows, tokens placed, pieces, crops, BOS tokens added, tokens dropped."""

    rows: int
    seq_len: int
    documents: int
    pieces: int
    crops: int
    bos_added: int  # BOS beyond one per document (splits and crops)
    dropped: int  # tokens of the final, incomplete row


def _pieces(docs: Iterable[Sequence[int]], width: int, bos: int, counter: list[int]) -> Iterator[list[int]]:
    step = width - 1
    for doc in docs:
        counter[0] += 1
        yield [bos, *doc[:step]]
        for start in range(step, len(doc), step):
            counter[1] += 1
            yield [bos, *doc[start:start + step]]


class _Buffer:
    """Pieces bucketed by length; best-fit lookups in O(log n). FIFO within a length (determinism)."""

    def __init__(self) -> None:
        self.by_len: dict[int, deque[list[int]]] = {}
        self.lengths: list[int] = []  # sorted distinct lengths present
        self.size = 0

    def add(self, piece: list[int]) -> None:
        n = len(piece)
        q = self.by_len.get(n)
        if q is None:
            q = self.by_len[n] = deque()
            bisect.insort(self.lengths, n)
        q.append(piece)
        self.size += 1

    def _take(self, n: int) -> list[int]:
        q = self.by_len[n]
        piece = q.popleft()
        if not q:
            del self.by_len[n]
            self.lengths.pop(bisect.bisect_left(self.lengths, n))
        self.size -= 1
        return piece

    def take_best_fit(self, space: int) -> list[int] | None:
        i = bisect.bisect_right(self.lengths, space)
        return self._take(self.lengths[i - 1]) if i else None

    def take_shortest(self) -> list[int]:
        return self._take(self.lengths[0])


def pack_rows(docs: Iterable[Sequence[int]], seq_len: int, bos_id: int, *, seed: int = 0,
              buffer: int = 1024, shuffle: bool = True, with_stats: bool = False):
    """Pack token documents (without BOS) into a ``torch.LongTensor [n_rows, seq_len + 1]``.

    See the module docstring for the algorithm. ``with_stats=True`` returns ``(rows, PackStats)``.
    """
    import numpy as np
    import torch

    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    width = seq_len + 1
    counter = [0, 0]  # documents, continuation pieces
    source = _pieces(docs, width, bos_id, counter)
    buf = _Buffer()
    exhausted = False

    def refill() -> None:
        nonlocal exhausted
        while not exhausted and buf.size < buffer:
            try:
                buf.add(next(source))
            except StopIteration:
                exhausted = True

    rows: list[list[int]] = []
    crops = 0
    dropped = 0
    while True:
        refill()
        if buf.size == 0:
            break
        row: list[int] = []
        while len(row) < width:
            refill()
            if buf.size == 0:
                break
            space = width - len(row)
            piece = buf.take_best_fit(space)
            if piece is None:
                piece = buf.take_shortest()
                row += piece[:space]
                buf.add([bos_id, *piece[space:]])
                crops += 1
            else:
                row += piece
        if len(row) == width:
            rows.append(row)
        else:
            dropped = len(row)
    order = list(range(len(rows)))
    if shuffle:
        random.Random(f"loopscale.packing:{seed}").shuffle(order)
    out = np.array(rows, dtype=np.int64).reshape(len(rows), width)
    tensor = torch.from_numpy(out[np.array(order, dtype=np.int64)] if rows else out)
    if with_stats:
        return tensor, PackStats(len(rows), seq_len, counter[0], counter[0] + counter[1] + crops, crops,
                                 counter[1] + crops, dropped)
    return tensor


def pack_texts(texts: Iterable[str], tokenizer: Tokenizer, seq_len: int, *, seed: int = 0,
               buffer: int = 1024, shuffle: bool = True, with_stats: bool = False):
    """Tokenize ``texts`` with ``tokenizer`` and ``pack_rows`` them."""
    encode = getattr(tokenizer, "encode_bytes", None) or tokenizer.encode
    return pack_rows((encode(t) for t in texts), seq_len, tokenizer.bos_id, seed=seed, buffer=buffer,
                     shuffle=shuffle, with_stats=with_stats)
