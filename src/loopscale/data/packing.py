"""BOS-aligned best-fit packing of documents into training rows of ``T + 1`` tokens.

The rows are the token stream a run trains on: ``inputs = row[:-1]``, ``targets = row[1:]``. They
depend only on the documents, the tokenizer, ``seq_len`` (T), the packing mode, the buffer size and
the seed — never on the model — so every architecture in a sweep sees exactly the same tokens, and a
run with budget D reads the first ``D / T`` rows. Every document becomes ``[BOS] + tokens``, every
row starts with BOS, and no row is ever padded. Two modes (``DataConfig.packing``):

``best_fit_crop`` (the default; the paper's packer, ``_pack_row`` / ``_pack_rows`` in its
``scripts/prepack.py``, arXiv 2604.21106 §4): before each row the buffer is topped up to
``buffer`` documents (in stream order); the row then repeatedly takes the *largest* buffered
document that fits entirely in the space left; when none fits, it takes the *shortest* buffered
document, crops it to fill the row exactly and **discards the cropped remainder**. A document is
never split across rows: everything past the first ``T + 1`` tokens of a long document is lost, and
so is the tail of every crop. Packing stops at the first row the buffer cannot fill (the buffer is
not refilled inside a row); the documents left are discarded too.

``best_fit_split`` (loopscale's earlier packer, kept bit for bit so older runs stay reproducible):
a document longer than a row is split into full rows of ``T + 1`` and a remainder, each
continuation with its own BOS; rows are filled from a buffer of ``buffer`` pieces, refilled before
every placement, by the same best fit; a crop's tail returns to the buffer as a new BOS-led piece.
Nothing but the final incomplete row is discarded; the cost is an extra BOS per split or crop.

Ties in either mode go to the piece that entered the buffer first (the paper's list scan), and the
rows are then shuffled with ``seed`` so that any prefix of rows is a uniform sample of the mixture
(the paper shuffles each output shard unseeded instead; the rows' contents are the same).
``pack_rows(..., with_stats=True)`` reports what was discarded (``PackStats.discard_fraction``).

``pack_rows`` holds every row; ``RowStream`` is the same packers one row at a time (memory bounded by
the buffer), and ``shuffle_order`` the same shuffle as an index, so that ``loopscale.data.cache`` can
pack a corpus far larger than memory into the rows ``pack_rows`` would give.
"""

from __future__ import annotations

import bisect
import random
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from loopscale.errors import ConfigError

Packing = Literal["best_fit_crop", "best_fit_split"]
PACKINGS: tuple[str, ...] = ("best_fit_crop", "best_fit_split")
DEFAULT_PACKING: Packing = "best_fit_crop"
# buffer sizes when none is configured: the paper's buffer_size, and the split packer's historic value
DEFAULT_BUFFER: dict[str, int] = {"best_fit_crop": 1000, "best_fit_split": 1024}


@dataclass(frozen=True)
class PackStats:
    """What packing did, so that what it discarded is visible: ``rows x (T + 1) = tokens + bos_added
    - discarded`` in both modes."""

    rows: int
    seq_len: int
    documents: int  # documents in the stream
    pieces: int  # split: BOS-led pieces made (documents, continuations, crop tails); crop: documents in rows
    crops: int
    bos_added: int  # BOS beyond one per document (split mode: splits and crops; crop mode: 0)
    dropped: int  # tokens left at the end: the final, incomplete row (crop: and any documents not reached)
    packing: str = "best_fit_split"
    tokens: int = 0  # tokens of the documents, one BOS each
    cropped: int = 0  # crop mode: tokens of the cropped-off remainders (discarded)

    @property
    def discarded(self) -> int:
        """Document tokens (BOS included) that are in no row."""
        return self.cropped + self.dropped

    @property
    def discard_fraction(self) -> float:
        return self.discarded / self.tokens if self.tokens else 0.0


def _ints(part: Sequence[int]) -> Sequence[int]:
    """A slice of a document as Python ints (a numpy slice is converted; lists and bytes are kept)."""
    tolist = getattr(part, "tolist", None)
    return tolist() if tolist is not None else part


def _pieces(docs: Iterable[Sequence[int]], width: int, bos: int, counter: list[int]) -> Iterator[list[int]]:
    step = width - 1
    for doc in docs:
        counter[0] += 1
        counter[2] += len(doc) + 1
        yield [bos, *_ints(doc[:step])]
        for start in range(step, len(doc), step):
            counter[1] += 1
            yield [bos, *_ints(doc[start : start + step])]


class _Buffer:
    """Pieces bucketed by length; best-fit lookups in O(log n). FIFO within a length (determinism).

    A piece may be stored under a length ``n`` larger than its list (crop mode keeps only the first
    ``T + 1`` tokens of a long document: no more can ever be placed, but its length orders it).
    """

    def __init__(self) -> None:
        self.by_len: dict[int, deque[list[int]]] = {}
        self.lengths: list[int] = []  # sorted distinct lengths present
        self.size = 0

    def add(self, piece: list[int], n: int | None = None) -> None:
        n = len(piece) if n is None else n
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


def _rows_split(
    docs: Iterable[Sequence[int]], width: int, bos_id: int, buffer: int, done: list[PackStats]
) -> Iterator[list[int]]:
    """loopscale's earlier packer: split long documents, re-queue crop tails (unchanged). Yields rows
    in packed order and appends its ``PackStats`` to ``done`` once exhausted."""
    counter = [0, 0, 0]  # documents, continuation pieces, document tokens (one BOS each)
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

    n_rows = crops = dropped = 0
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
            n_rows += 1
            yield row
        else:
            dropped = len(row)
    done.append(
        PackStats(
            n_rows,
            width - 1,
            counter[0],
            counter[0] + counter[1] + crops,
            crops,
            counter[1] + crops,
            dropped,
            "best_fit_split",
            counter[2],
            0,
        )
    )


def _rows_crop(
    docs: Iterable[Sequence[int]], width: int, bos_id: int, buffer: int, count_rest: bool, done: list[PackStats]
) -> Iterator[list[int]]:
    """The paper's packer: whole documents by best fit, the shortest cropped, its remainder discarded.
    Yields rows in packed order and appends its ``PackStats`` to ``done`` once exhausted."""
    source = iter(docs)
    buf = _Buffer()
    exhausted = False
    documents = tokens = 0

    def refill() -> None:
        nonlocal exhausted, documents, tokens
        while not exhausted and buf.size < buffer:
            try:
                doc = next(source)
            except StopIteration:
                exhausted = True
                break
            n = len(doc) + 1
            documents += 1
            tokens += n
            buf.add([bos_id, *_ints(doc[: width - 1])], n)  # past T + 1 tokens nothing can be placed

    n_rows = placed = crops = cropped = dropped = 0
    while True:
        refill()  # the paper tops the buffer up before each row only
        if buf.size == 0:
            break
        row: list[int] = []
        n_row = 0
        while len(row) < width and buf.size:
            space = width - len(row)
            piece = buf.take_best_fit(space)
            if piece is None:
                n = buf.lengths[0]
                piece = buf.take_shortest()
                row += piece[:space]
                crops += 1
                cropped += n - space
            else:
                row += piece
            n_row += 1
        if len(row) < width:  # the buffer ran dry: the paper stops here
            dropped = len(row)
            break
        n_rows += 1
        placed += n_row
        yield row
    if count_rest:  # documents the packer never reached are discarded too; count them
        for doc in source:
            documents += 1
            tokens += len(doc) + 1
            dropped += len(doc) + 1
    done.append(PackStats(n_rows, width - 1, documents, placed, crops, 0, dropped, "best_fit_crop", tokens, cropped))


def check_packing(packing: str, buffer: int | None) -> int:
    """The buffer size to use for ``packing``; a one-line error naming the field if either is bad."""
    if packing not in PACKINGS:
        raise ConfigError("data.packing", f"must be one of {', '.join(PACKINGS)}", value=packing)
    if buffer is None:
        return DEFAULT_BUFFER[packing]
    if buffer < 1:
        raise ConfigError("data.packing_buffer", "must be a positive number of documents", value=buffer)
    return buffer


def pack_rows(
    docs: Iterable[Sequence[int]],
    seq_len: int,
    bos_id: int,
    *,
    seed: int = 0,
    packing: str = DEFAULT_PACKING,
    buffer: int | None = None,
    shuffle: bool = True,
    with_stats: bool = False,
):
    """Pack token documents (without BOS) into a ``torch.LongTensor [n_rows, seq_len + 1]``.

    See the module docstring for the two modes. ``buffer=None`` uses the mode's default (1000 for
    ``best_fit_crop`` as in the paper, 1024 for ``best_fit_split`` as before). ``with_stats=True``
    returns ``(rows, PackStats)``.
    """
    import numpy as np
    import torch

    width = seq_len + 1
    stream = RowStream(docs, seq_len, bos_id, packing=packing, buffer=buffer, count_rest=with_stats)
    rows = list(stream)
    out = np.array(rows, dtype=np.int64).reshape(len(rows), width)
    if shuffle and rows:
        out = out[np.frombuffer(shuffle_order(len(rows), seed), dtype=np.int64)]
    tensor = torch.from_numpy(out)
    if with_stats:
        return tensor, stream.stats
    return tensor


class RowStream:
    """The packed rows of ``docs`` in packed (unshuffled) order, one ``list`` of ``T + 1`` ints at a time
    (iterate once).

    Memory is bounded by the packer's buffer, not by the stream: ``buffer`` documents (crop: each cut
    to its first ``T + 1`` tokens) or ``buffer`` pieces of at most ``T + 1`` tokens (split), as Python
    ints (~40 B per id above 256), plus the document being read. ``stats`` is set once exhausted.
    ``count_rest``: crop mode reads (and counts) the documents after its last row, so that a side
    effect of reading them (a fingerprint) sees the whole stream and ``stats`` counts them.
    """

    def __init__(
        self,
        docs: Iterable[Sequence[int]],
        seq_len: int,
        bos_id: int,
        *,
        packing: str = DEFAULT_PACKING,
        buffer: int | None = None,
        count_rest: bool = True,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        size = check_packing(packing, buffer)
        self._done: list[PackStats] = []
        width = seq_len + 1
        if packing == "best_fit_split":
            self._rows = _rows_split(docs, width, bos_id, size, self._done)
        else:
            self._rows = _rows_crop(docs, width, bos_id, size, count_rest, self._done)

    def __iter__(self) -> Iterator[list[int]]:
        return self._rows

    @property
    def stats(self) -> PackStats | None:
        return self._done[0] if self._done else None


def shuffle_order(n: int, seed: int) -> array:
    """The row order ``pack_rows`` shuffles into: ``order[k]`` is the packed index of the k-th row.

    ``random.Random(f"loopscale.packing:{seed}").shuffle`` of ``0 .. n-1``, as it always was, but on
    an ``array('q')`` (8 B per row) instead of a list of Python ints (~36 B per row): ``shuffle`` only
    swaps items, so the order is the same.
    """
    order = array("q", range(n))
    random.Random(f"loopscale.packing:{seed}").shuffle(order)
    return order
