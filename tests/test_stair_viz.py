"""STAIR top-term bar charts render real content."""

import numpy as np
import pytest
from conftest import TINY_TEXT, TINY_VISION
from PIL import Image

from vlzoo import viz
from vlzoo.models.stair import STAIR


def _picture(path):
    return np.asarray(Image.open(path).convert("RGB"), np.float32)


def test_top_terms_chart_draws_labelled_bars(tmp_path):
    terms = [("dog", 2.4), ("beach", 1.1), ("sand", 0.3)]
    picture = _picture(viz.top_terms_chart(terms, tmp_path / "terms.png", title="an image"))
    assert picture.std() > 20
    # Other weights give other bars; an image adds a panel.
    other = _picture(viz.top_terms_chart([("dog", 0.2), ("beach", 1.1), ("sand", 2.9)], tmp_path / "other.png",
                                         title="an image"))
    assert other.shape == picture.shape and np.abs(other - picture).mean() > 1.0
    image = np.zeros((32, 32, 3), np.uint8)
    image[8:24, 8:24] = (220, 40, 40)
    wide = _picture(viz.top_terms_chart(terms, tmp_path / "wide.png", image=image))
    assert wide.shape[1] > picture.shape[1]
    with pytest.raises(ValueError, match="terms"):
        viz.top_terms_chart([], tmp_path / "x.png")


def test_draw_image_terms_from_a_model(tmp_path):
    model = STAIR(vision=dict(TINY_VISION), text=dict(TINY_TEXT), excluded_token_ids=None)
    image = np.random.default_rng(0).normal(size=(32, 32, 3)).astype("float32")
    path = viz.draw_image_terms(model, image, tmp_path / "terms.png", k=6)
    assert _picture(path).std() > 20
