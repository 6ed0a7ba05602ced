"""`family=`: FILIP, SPARC, SPARO, Llip, STAIR and FLAIR started from a CLIP checkpoint (`vlzoo.transfer`).

The source is a tiny CLIP whose every weight is random but distinct (its logit scale moved off
the default, so a copied scale cannot pass by coincidence). "Exactly" means bit for bit: the
target's towers run the same operations on the same values as CLIP's.
"""

import keras
import numpy as np
import pytest
from conftest import fit_and_measure, tiny_batch, to_numpy
from families import TRANSFER_FAMILIES

import vlzoo
from vlzoo.models import get_family
from vlzoo.transfer import TransferReport

BATCH = dict(batch_size=4, sequence_length=12)
TINY = {"sparo": dict(num_slots=4, slot_dim=8), "llip": dict(vision=dict(num_prefix_tokens=4))}
# What each family must report as new (its own parameters), by layer.
NEW = {
    "filip": set(),
    "sparc": {"vision_head"},
    "sparo": {"vision_readout", "text_readout"},
    "llip": {"logit_scale", "logit_bias", "vision/prefix_tokens", "cross_attention"},
    "stair": {"image_head", "text_head"},
    "flair": {"logit_scale", "logit_bias", "text_pooling"},
}
SCALE = 3.25


@pytest.fixture(scope="module")
def clip():
    keras.utils.set_random_seed(7)
    model = vlzoo.from_preset("clip_tiny", load_weights=False)
    model.logit_scale.assign(SCALE)
    return model


def _transfer(clip, family, **overrides):
    model, report = vlzoo.transfer.from_clip(clip, family, verbose=False, **{**TINY.get(family, {}), **overrides})
    assert isinstance(report, TransferReport)
    return model, report


def _layers(paths):
    return {path.split("/")[0] if not path.startswith("vision/prefix") else path for path in paths}


def _tower_tokens(model, batch):
    image = to_numpy(model.vision(batch["images"])["tokens"])
    text = to_numpy(model.text(batch["token_ids"], batch["padding_mask"])["tokens"])
    return image, text


def _real(text, mask):
    return text[np.asarray(mask, bool)]


@pytest.mark.parametrize("family", ["filip", "sparc", "stair"])
def test_towers_give_clips_token_features_exactly(clip, family):
    batch = tiny_batch(**BATCH)
    model, report = _transfer(clip, family)
    image, text = _tower_tokens(model, batch)
    clip_image, clip_text = _tower_tokens(clip, batch)
    np.testing.assert_array_equal(image, clip_image)
    np.testing.assert_array_equal(_real(text, batch["padding_mask"]), _real(clip_text, batch["padding_mask"]))
    assert _layers(report.new) == NEW[family]
    scale = float(to_numpy(model.logit_scale))
    assert scale == SCALE  # softmax InfoNCE on exp(scale) * cos, as CLIP's: the scale keeps its role
    assert type(model.tokenizer) is type(clip.tokenizer) and model.tokenizer(["a dog"])["token_ids"].tolist() == \
        clip.tokenizer(["a dog"])["token_ids"].tolist()


def test_a_family_projecting_to_embed_dim_keeps_clips_projections_without_a_hook(clip):
    """tests/extension_family.py's head-wise CLIP keeps CLIP's tower defaults (`output_dim = embed_dim`) and writes
    no `configure`: the transfer keeps CLIP's width and both projections, so it starts with CLIP's embeddings."""
    assert get_family("headwise_clip").from_clip.configure is None
    batch = tiny_batch(**BATCH)
    model, report = _transfer(clip, "headwise_clip")
    assert model.embed_dim == clip.embed_dim
    for tower in ("vision", "text"):
        assert report.transferred[f"{tower}/projection/kernel"] == f"{tower}/projection/kernel"
    assert report.new == ["head_logit_offset"] and report.left_out == []
    tolerance = dict(rtol=1e-5, atol=1e-6)  # two compiled programs of the same computation (see below)
    np.testing.assert_allclose(to_numpy(model.encode_image(batch["images"])["embeds"]),
                               to_numpy(clip.encode_image(batch["images"])["embeds"]), **tolerance)
    np.testing.assert_allclose(to_numpy(model.encode_text(batch)["embeds"]),
                               to_numpy(clip.encode_text(batch)["embeds"]), **tolerance)


@pytest.mark.parametrize("family", ["filip", "sparc"])
def test_token_projections_are_clips_projections(clip, family):
    """FILIP's and SPARC's image/text tokens are CLIP's tower tokens through CLIP's own projections."""
    batch = tiny_batch(**BATCH)
    model, report = _transfer(clip, family)
    assert report.transferred["image_projection/kernel"] == "vision/projection/kernel"
    image, text = _tower_tokens(clip, batch)
    clip_image = to_numpy(clip.vision.projection(image[:, 1:]))  # the CLS token is not a patch
    clip_text = to_numpy(clip.text.projection(text))
    encoded_image, encoded_text = model.encode_image(batch["images"]), model.encode_text(batch)
    # The reference runs operation by operation; `encode_*` runs one compiled program on JAX and TensorFlow,
    # whose fused LayerNorms and sums round differently: a few float32 ulps of values up to ~3 (measured
    # 1.2e-6 relative on JAX), far below the change a wrong projection would make.
    tolerance = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(encoded_image["tokens"]), clip_image, **tolerance)
    np.testing.assert_allclose(_real(to_numpy(encoded_text["tokens"]), batch["padding_mask"]),
                               _real(clip_text, batch["padding_mask"]), **tolerance)


def test_sparo_towers_are_clip_without_its_last_block(clip):
    """SPARO's read-out replaces the last block: its towers equal CLIP's with that block made the
    identity (its attention output and second MLP layer zeroed: a pre-LN block adds nothing)."""
    batch = tiny_batch(**BATCH)
    model, report = _transfer(clip, "sparo")
    assert _layers(report.new) == NEW["sparo"]
    assert _layers(report.left_out) == {"vision", "text"}  # the last blocks and the projections
    assert float(to_numpy(model.logit_scale)) == SCALE
    reference = vlzoo.from_preset("clip_tiny", load_weights=False)
    reference.set_weights(clip.get_weights())
    for tower in (reference.vision, reference.text):
        last = tower.blocks[-1]
        for variable in last.attention.output_dense.weights + last.mlp.fc2.weights:
            variable.assign(keras.ops.zeros(variable.shape))
    image, text = _tower_tokens(model, batch)
    reference_image, reference_text = _tower_tokens(reference, batch)
    np.testing.assert_array_equal(image, reference_image)
    np.testing.assert_array_equal(_real(text, batch["padding_mask"]), _real(reference_text, batch["padding_mask"]))


def test_llip_keeps_clips_text_embedding_and_positions(clip):
    batch = tiny_batch(**BATCH)
    model, report = _transfer(clip, "llip")  # K = 4 mixture tokens
    assert _layers(report.new) == NEW["llip"]
    np.testing.assert_array_equal(to_numpy(model.encode_text(batch)["embeds"]),
                                  to_numpy(clip.encode_text(batch)["embeds"]))
    positions = to_numpy(model.vision.position_embedding.embeddings)
    clip_positions = to_numpy(clip.vision.position_embedding.embeddings)
    np.testing.assert_array_equal(positions[4:], clip_positions[1:])  # the patches'
    np.testing.assert_array_equal(positions[:4], np.repeat(clip_positions[:1], 4, axis=0))  # CLS's, K times
    assert float(to_numpy(model.logit_scale)) == pytest.approx(model.init_logit_scale)  # sigmoid loss: its own
    assert float(to_numpy(model.logit_bias)) == -10.0
    # K = 1 is CLIP's layout: the class token itself transfers and the image tower is CLIP's.
    single, report = _transfer(clip, "llip", vision=dict(num_prefix_tokens=1))
    assert "vision/prefix_tokens" in report.transferred
    np.testing.assert_array_equal(_tower_tokens(single, batch)[0], _tower_tokens(clip, batch)[0])


def test_flair_starts_from_clips_embeddings(clip):
    """FLAIR's global image and caption embeddings are CLIP's, and its patch tokens are CLIP's image projection of
    CLIP's patch outputs; the pooling and the sigmoid loss's scale and bias are FLAIR's own."""
    batch = tiny_batch(**BATCH)
    model, report = _transfer(clip, "flair")
    assert _layers(report.new) == NEW["flair"] and report.left_out == ["logit_scale"]
    image, text = model.encode_image(batch["images"]), model.encode_text(batch)
    # FLAIR projects every token at once and CLIP the CLS row alone: XLA may order the 32-term sums differently.
    np.testing.assert_allclose(to_numpy(image["embeds"]), to_numpy(clip.encode_image(batch["images"])["embeds"]),
                               atol=1e-6, rtol=0)
    np.testing.assert_allclose(to_numpy(text["embeds"]), to_numpy(clip.encode_text(batch)["embeds"]), atol=1e-6,
                               rtol=0)
    patches = _tower_tokens(clip, batch)[0][:, 1:] @ to_numpy(clip.vision.projection.kernel)
    np.testing.assert_allclose(to_numpy(image["tokens"]), patches, atol=1e-5, rtol=0)
    assert float(to_numpy(model.logit_scale)) == pytest.approx(model.init_logit_scale)
    assert float(to_numpy(model.logit_bias)) == -10.0


def test_from_preset_family_on_a_saved_clip_and_the_errors(clip, tmp_path):
    """`from_preset(directory, family=...)` equals `from_clip`; the result saves and loads back
    exactly; a non-CLIP source, an unknown family and a resized tower are refused by name."""
    batch = tiny_batch(**BATCH)
    clip.save_to_preset(str(tmp_path / "clip"))
    model = vlzoo.from_preset(str(tmp_path / "clip"), family="sparc", lambda_fine=2.0)
    assert model.family == "sparc" and model.lambda_fine == 2.0
    np.testing.assert_array_equal(_tower_tokens(model, batch)[0], _tower_tokens(clip, batch)[0])
    model.save_to_preset(str(tmp_path / "sparc"))
    loaded = vlzoo.from_preset(str(tmp_path / "sparc"))
    for name in ("embeds", "tokens"):
        np.testing.assert_array_equal(to_numpy(loaded.encode_image(batch["images"])[name]),
                                      to_numpy(model.encode_image(batch["images"])[name]))
    # The preset's own family: the preset as it is.
    same = vlzoo.from_preset(str(tmp_path / "clip"), family="clip")
    np.testing.assert_array_equal(to_numpy(same.encode_image(batch["images"])["embeds"]),
                                  to_numpy(clip.encode_image(batch["images"])["embeds"]))
    with pytest.raises(ValueError, match="family"):
        vlzoo.from_preset(str(tmp_path / "clip"), family="siglip")
    with pytest.raises(ValueError, match="CLIP checkpoint.*SPARC"):
        vlzoo.from_preset(str(tmp_path / "sparc"), family="filip")
    with pytest.raises(ValueError, match=r"`vision/block_0/mlp/fc1/kernel` has shape \(32, 128\)"):
        vlzoo.transfer.from_clip(clip, "filip", verbose=False, vision=dict(intermediate_dim=128))


def _below(model, variable):
    """A variable's path below the model (`vision/block_0/...`, `logit_scale`), as the report names it."""
    prefix = f"{model.name}/"
    return variable.path[len(prefix):] if variable.path.startswith(prefix) else variable.path


@pytest.mark.parametrize("family", TRANSFER_FAMILIES)
def test_every_transferred_weight_is_clips_and_every_other_is_new(clip, family):
    """The report accounts for every trainable variable: copied from CLIP (equal to the CLIP weight it names,
    up to Llip's position rows, which repeat CLIP's CLS row) or new; CLIP's that were not used are left out."""
    model, report = _transfer(clip, family)
    source = {_below(clip, v): to_numpy(v) for v in clip.variables}
    target = {_below(model, v): v for v in model.variables}
    trainable = {_below(model, v) for v in model.trainable_variables}
    assert trainable <= set(report.transferred) | set(report.new)
    assert not set(report.transferred) & set(report.new)
    for path, origin in report.transferred.items():
        value = to_numpy(target[path])
        if value.shape == source[origin].shape:
            np.testing.assert_array_equal(value, source[origin], err_msg=path)
    assert set(report.left_out) == set(source) - set(report.transferred.values())


@pytest.mark.slow
@pytest.mark.parametrize("family", TRANSFER_FAMILIES)
def test_fit_fine_tunes_on_the_familys_own_loss(clip, family):
    model, _ = _transfer(clip, family)
    before, after = fit_and_measure(model, tiny_batch(**BATCH), epochs=6, training=True)
    assert after < before, (before, after)
