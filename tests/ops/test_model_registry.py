"""The checklist of an architecture, enforced: every registered ``model_type`` has a tiny
family in ``tests/helpers/families.py`` (so test_families runs it against transformers) and a
row in docs/MODELS.md's table; an unknown architecture or an unbuilt feature is refused with a
message naming it."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixserve.model.registry import architectures, model_class
from tests.helpers.families import FAMILIES

DOC = Path(__file__).resolve().parents[2] / "docs" / "MODELS.md"


def _family_types() -> set[str]:
    types = set()
    for build in FAMILIES.values():
        cls, kw = build()
        types.add(cls(**kw).model_type)
    return types


def test_every_architecture_has_a_tiny_family_tested_against_transformers():
    tested = _family_types()
    classes = architectures()
    untested = {cls.__name__ for t, cls in classes.items()} - {classes[t].__name__ for t in tested if t in classes}
    assert not untested, f"add a family to tests/helpers/families.py for {sorted(untested)}"


def test_every_architecture_is_in_the_docs_table():
    rows = DOC.read_text()
    for model_type in architectures():
        assert re.search(rf"`{re.escape(model_type)}`", rows), f"docs/MODELS.md has no row for {model_type}"


def test_unknown_architecture_is_refused_naming_it():
    with pytest.raises(ValueError, match="'falcon_mamba' is not supported"):
        model_class(SimpleNamespace(model_type="falcon_mamba"))


def test_multimodal_gemma3_is_refused_naming_the_image_encoder(tmp_path):
    from transformers import Gemma3Config

    from radixserve.model.loader import load_config

    Gemma3Config().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="image encoder"):
        load_config(str(tmp_path))
