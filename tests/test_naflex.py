"""SigLIP 2's NaFlex: images at their own aspect ratio as padded patch batches, against transformers' Siglip2."""

import math

import keras
import numpy as np
import pytest
from conftest import tiny_model, to_numpy
from test_convert_transformers import hf, torch  # noqa: F401  (the transformers fixtures)

import vlzoo
import vlzoo.convert as vc
from vlzoo.layers.embedding import antialiased_bilinear_weights
from vlzoo.preprocessing import NaFlexPreprocessor, naflex_size

pytestmark = pytest.mark.peer

PATCH, BUDGET = 4, 16  # a 4 x 4 position grid; images of 16 patches at most


def _images(seed=0):
    # Three aspect ratios: wide, tall, and square and small (upsampled to the budget).
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=shape, dtype=np.uint8) for shape in ((20, 44, 3), (50, 14, 3), (9, 9, 3))]


def _peer(hf, torch, seed=0):
    torch.manual_seed(seed)
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
    config = hf.Siglip2Config(
        text_config=dict(vocab_size=64, max_position_embeddings=12, projection_size=32, **common),
        vision_config=dict(patch_size=PATCH, num_patches=BUDGET, **common),
    )
    model = hf.Siglip2Model(config).eval()
    with torch.no_grad():  # transformers initialises both to 0
        model.logit_scale.fill_(math.log(10.0))
        model.logit_bias.fill_(-3.0)
        for module in model.modules():  # LayerNorms and biases away from their initial 1 and 0
            for name, parameter in module.named_parameters(recurse=False):
                if name == "bias" or (name == "weight" and parameter.ndim == 1):
                    parameter.add_(0.2 * torch.randn_like(parameter))
    return model


def _peer_processor(hf):
    return hf.Siglip2ImageProcessorPil(patch_size=PATCH, max_num_patches=BUDGET)


def test_naflex_size_matches_transformers(hf):
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    for (h, w) in ((480, 640), (224, 224), (1000, 100), (7, 3000), (20, 44), (50, 14), (9, 9)):
        for patch, budget in ((16, 256), (16, 576), (14, 1024), (PATCH, BUDGET)):
            assert naflex_size(h, w, patch, budget) == get_image_size_for_max_num_patches(h, w, patch, budget)
    assert naflex_size(480, 640, 16, 256) == (224, 288)  # 14 x 18 = 252 patches


def test_preprocessor_matches_transformers(hf):
    # uint8 images resized with PIL's bilinear filter, normalised, patches in row, column, channel order.
    images = _images()
    ours = NaFlexPreprocessor(PATCH, BUDGET)(images)
    theirs = _peer_processor(hf)(images, return_tensors="np")
    np.testing.assert_array_equal(ours["spatial_shapes"], theirs["spatial_shapes"])
    np.testing.assert_array_equal(ours["patch_mask"], theirs["pixel_attention_mask"].astype(bool))
    np.testing.assert_allclose(ours["patches"], theirs["pixel_values"], atol=1e-6)
    assert ours["spatial_shapes"].tolist() == [[3, 5], [8, 2], [4, 4]]  # 15, 16 and 16 of the 16 patches
    assert NaFlexPreprocessor.from_config(NaFlexPreprocessor(PATCH, BUDGET).get_config()).max_num_patches == BUDGET
    with pytest.raises(ValueError, match="max_num_patches"):
        NaFlexPreprocessor(PATCH, 0)


def test_position_weights_are_torch_antialiased_bilinear(torch):
    # Each output row of the weights applied to a 1-D signal is torch's antialiased bilinear resize of it,
    # shrinking (the triangle widened by the scale) and growing alike.
    grid = 7
    signal = torch.randn(1, 1, 1, grid, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # torch resizes the float64 signal in float64; our weights are float32, each a few float32 operations
    # (the triangle, its normalisation by a sum of at most `grid` terms), so each is within 16 float32 ulps of
    # its exact value, and they are non-negative and sum to 1: the resized value is within 16 ulps of the
    # signal's largest magnitude. A wrong kernel is off by 1e-2 and more.
    bound = 16 * np.finfo(np.float32).eps * float(signal.abs().max())
    for size in (1, 2, 3, 5, 7, 12):
        want = torch.nn.functional.interpolate(signal, size=(1, size), mode="bilinear", align_corners=False,
                                               antialias=True)[0, 0, 0].numpy()
        weights = to_numpy(antialiased_bilinear_weights(np.arange(size)[None], np.array([[size]]), grid))[0]
        assert weights.min() >= 0 and np.allclose(weights.sum(axis=-1), 1.0, atol=1e-6)
        np.testing.assert_allclose(weights @ signal[0, 0, 0].numpy(), want, rtol=0, atol=bound)


def test_converted_siglip2_matches_transformers_on_mixed_aspect_ratios(hf, torch):
    peer = _peer(hf, torch)
    model = vc.from_transformers(peer)
    assert model.vision.image_size == PATCH * 4 and model.accepts_patch_batches
    batch = NaFlexPreprocessor(PATCH, BUDGET)(_images(seed=1))
    with torch.no_grad():
        want = peer.get_image_features(
            pixel_values=torch.from_numpy(batch["patches"]),
            pixel_attention_mask=torch.from_numpy(batch["patch_mask"].astype(np.int32)),
            spatial_shapes=torch.from_numpy(batch["spatial_shapes"]).long())
    want = getattr(want, "pooler_output", want).numpy()
    got = to_numpy(model.encode_image(batch)["embeds"])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    # Through the compiled path too, and the padding patches' content does not matter.
    noisy = dict(batch, patches=np.where(batch["patch_mask"][..., None], batch["patches"],
                                         np.random.default_rng(2).normal(size=batch["patches"].shape))
                 .astype("float32"))
    predicted = model.predict_on_batch({"images": noisy})["image_embeds"]
    np.testing.assert_allclose(predicted, want, atol=1e-4, rtol=1e-4)
    # Each image alone, at its own budget-free padding, gives its row of the batch.
    for i in range(len(got)):
        alone = {key: value[i : i + 1] for key, value in batch.items()}
        np.testing.assert_allclose(to_numpy(model.encode_image(alone)["embeds"])[0], got[i], atol=1e-5)


def test_square_images_of_the_table_grid_match_the_patch_batch(hf, torch):
    # At the position table's own grid the resize is the identity, so a square image through the
    # convolution gives what its patches give.
    model = vc.from_transformers(_peer(hf, torch))
    size = model.vision.image_size
    image = np.random.default_rng(3).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    batch = NaFlexPreprocessor(PATCH, BUDGET)([image])
    assert batch["spatial_shapes"].tolist() == [[4, 4]]
    pixels = (image.astype(np.float32) / 255.0 - 0.5) / 0.5  # the patches' normalisation
    np.testing.assert_allclose(to_numpy(model.encode_image(pixels[None])["embeds"]),
                               to_numpy(model.encode_image(batch)["embeds"]), atol=1e-5)


@pytest.mark.filterwarnings("ignore:Preset .filip_tiny. has no weights")
def test_patch_batches_are_checked():
    model = tiny_model("siglip")
    p = model.vision.patch_size
    batch = {"patches": np.zeros((2, 8, p * p * 3), "float32"), "patch_mask": np.ones((2, 8), bool),
             "spatial_shapes": np.array([[2, 4], [4, 2]], "int32")}
    assert to_numpy(model.encode_image(batch)["embeds"]).shape == (2, model.embed_dim)
    with pytest.raises(ValueError, match=r"images\['patches'\].*\(B, N, " + str(p * p * 3)):
        model.encode_image(dict(batch, patches=np.zeros((2, 8, 5), "float32")))
    with pytest.raises(ValueError, match=r"images\['patch_mask'\]"):
        model.encode_image(dict(batch, patch_mask=np.ones((2, 7), bool)))
    with pytest.raises(ValueError, match=r"spatial_shapes.*mask counts \[8, 8\]"):
        model.encode_image(dict(batch, spatial_shapes=np.array([[2, 4], [3, 2]], "int32")))
    with pytest.raises(NotImplementedError, match="FILIP reads the image tower's tokens"):
        vlzoo.from_preset("filip_tiny").encode_image(batch)


def test_a_patch_batch_trains_with_the_loss_inference_gives():
    # `fit` / `train_on_batch` read NaFlex batches under `images`: the first step's loss is the loss of
    # the model's own forward pass on them, and the step moves the weights.
    model = tiny_model("siglip")
    p = model.vision.patch_size
    rng = np.random.default_rng(4)
    grids = np.array([[2, 4], [3, 2], [1, 5]], "int32")
    mask = np.arange(8)[None] < np.prod(grids, axis=1)[:, None]
    texts = {"token_ids": rng.integers(1, 64, size=(3, 12)).astype("int32"), "padding_mask": np.ones((3, 12), bool)}
    batch = {"images": {"patches": (rng.normal(size=(3, 8, p * p * 3)) * mask[..., None]).astype("float32"),
                        "patch_mask": mask, "spatial_shapes": grids}, **texts}
    want = float(to_numpy(model.compute_loss(x=batch, training=False)))
    model.compile(optimizer=keras.optimizers.AdamW(1e-2))
    first = model.train_on_batch(batch)
    assert first == pytest.approx(want, rel=1e-5)
    second = model.train_on_batch(batch)
    assert np.isfinite(second) and second != pytest.approx(first, rel=1e-6)


def test_a_cls_tower_gives_a_square_image_the_same_embedding_as_its_patches():
    # CLIP's tower prepends its class token (with its own position row) to the patch batch: at the table's
    # own grid the resize is the identity, so the patches of a square image give the image's embedding.
    model = tiny_model("clip")
    size, p = model.vision.image_size, model.vision.patch_size
    grid = size // p
    pixels = np.random.default_rng(5).normal(size=(1, size, size, 3)).astype("float32")
    patches = pixels.reshape(1, grid, p, grid, p, 3).transpose(0, 1, 3, 2, 4, 5).reshape(1, grid * grid, -1)
    pad = np.zeros((1, 3, patches.shape[-1]), "float32")  # three padding patches
    batch = {"patches": np.concatenate([patches, pad], axis=1),
             "patch_mask": np.arange(grid * grid + 3)[None] < grid * grid,
             "spatial_shapes": np.array([[grid, grid]], "int32")}
    np.testing.assert_allclose(to_numpy(model.encode_image(batch)["embeds"]),
                               to_numpy(model.encode_image(pixels)["embeds"]), atol=1e-5)
