"""MetaCLIP 2 (transformers' `MetaClip2Model`) -> `vlzoo.CLIP`: CLIP's network with the text pooled at the first
end token (`eos_token_id`, XLM-V's `</s>` = 2), on the active backend.

The peers are built offline from configs, with random weights, at each public geometry (`GEOMETRIES`: every
width, head count, MLP width, patch and image size and context length of the released configs) with two blocks
per tower and a 1,000-piece vocabulary (the released 901,629 rows would need gigabytes for nothing the
comparison needs). The texts are laid out as the checkpoints' tokenizers lay them out (`LAYOUTS`: XLM-V's and
mT5's), with pieces above the special ids, so a model that pooled at the largest id would fail.
"""

import numpy as np
import pytest

import vlzoo
import vlzoo.convert as vc
from vlzoo.layers import TextTransformer

from backend_utils import run_once
from test_convert_transformers import hf, torch  # noqa: F401  (transformers and torch, or a skip)

try:
    import peers
except ImportError:  # tests/ imported as a package
    from tests import peers

pytestmark = pytest.mark.peer

DEPTH, VOCAB = 2, 1000
# How each tokenizer lays out a caption: XLM-V's (`<s>` 0, pieces, `</s>` 2, `<pad>` 1) and mT5's (pieces, `</s>` 1,
# `<pad>` 0).
LAYOUTS = {"xlm_v": dict(start=0, end=2, pad=1), "mt5": dict(start=None, end=1, pad=0)}
# Released checkpoint -> vision (width, heads, MLP width, patch, image size), text (width, heads, MLP width,
# context), the projection's width and the activation of both towers, from its config.json.
GEOMETRIES = {
    "facebook/metaclip-2-worldwide-s16": dict(vision=(384, 6, 1536, 16, 224), text=(384, 6, 1536, 77), projection=384),
    "facebook/metaclip-2-worldwide-m16": dict(vision=(512, 8, 2048, 16, 224), text=(512, 8, 2048, 77), projection=512),
    "facebook/metaclip-2-worldwide-b32": dict(vision=(768, 12, 3072, 32, 224), text=(512, 8, 2048, 77), projection=512),
    "facebook/metaclip-2-worldwide-b16": dict(vision=(768, 12, 3072, 16, 224), text=(512, 8, 2048, 77), projection=512),
    "facebook/metaclip-2-worldwide-l14": dict(vision=(1024, 16, 4096, 14, 224), text=(768, 12, 3072, 77),
                                              projection=768),
    "facebook/metaclip-2-worldwide-huge-quickgelu": dict(vision=(1280, 16, 5120, 14, 224), text=(1024, 16, 4096, 77),
                                                         projection=1024, act="quick_gelu"),
    "facebook/metaclip-2-worldwide-huge-378": dict(vision=(1280, 16, 5120, 14, 378), text=(1024, 16, 4096, 77),
                                                   projection=1024),
    "facebook/metaclip-2-worldwide-giant": dict(vision=(1664, 16, 8192, 14, 224), text=(1280, 20, 5120, 77),
                                                projection=1280),
    "facebook/metaclip-2-worldwide-giant-378": dict(vision=(1664, 16, 8192, 14, 378), text=(1280, 20, 5120, 77),
                                                    projection=1280),
}
# The mT5-tokenized checkpoints (facebook/metaclip-2-mt5-worldwide-{s16,m16,b32}) are the s16, m16 and b32 networks
# with a 250,000-piece vocabulary whose end token is 1: checked at b32's geometry with that end token.
CASES = [(name, "xlm_v") for name in sorted(GEOMETRIES)] + [("facebook/metaclip-2-worldwide-b32", "mt5")]


def _peer(hf, torch, vision, text, projection, act="gelu", layout="xlm_v", seed=0):
    width, heads, mlp, patch, image = vision
    text_width, text_heads, text_mlp, context = text
    config = hf.MetaClip2Config(
        vision_config=dict(hidden_size=width, num_attention_heads=heads, intermediate_size=mlp, patch_size=patch,
                           image_size=image, num_hidden_layers=DEPTH, hidden_act=act),
        text_config=dict(hidden_size=text_width, num_attention_heads=text_heads, intermediate_size=text_mlp,
                         max_position_embeddings=context, num_hidden_layers=DEPTH, hidden_act=act, vocab_size=VOCAB,
                         eos_token_id=LAYOUTS[layout]["end"], pad_token_id=LAYOUTS[layout]["pad"]),
        projection_dim=projection,
    )
    torch.manual_seed(seed)
    model = hf.MetaClip2Model(config).eval()
    with torch.no_grad():  # LayerNorms and biases start at constants: moved, so every weight is checked
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    return model


def _texts(batch, context, start, end, pad, seed=0):
    """Captions as a tokenizer of `LAYOUTS` lays them out, pieces in [3, VOCAB), of other lengths per row."""
    rng = np.random.default_rng(seed)
    ids = np.full((batch, context), pad, "int32")
    first = 0 if start is None else 1
    for row, length in enumerate(rng.integers(1, context - 2, batch)):
        if start is not None:
            ids[row, 0] = start
        ids[row, first:first + length] = rng.integers(3, VOCAB, length)
        ids[row, first + length] = end
    return {"token_ids": ids, "padding_mask": ids != pad}


@pytest.mark.parametrize("checkpoint, layout", CASES)
def test_parity_with_transformers_at_every_geometry(hf, torch, checkpoint, layout):
    peer = _peer(hf, torch, **GEOMETRIES[checkpoint], layout=layout)
    model = vc.from_transformers(peer)
    end = LAYOUTS[layout]["end"]
    assert isinstance(model, vlzoo.CLIP) and model.text.end_token_id == end and model.text.pooling == "eot"
    images, _ = peers.parity_inputs(model, 2)
    texts = _texts(2, model.text.sequence_length, **LAYOUTS[layout])
    # The largest id is a piece: pooling there, not at the end token, would fail.
    assert (np.argmax(texts["token_ids"], axis=-1) != np.argmax(texts["token_ids"] == end, axis=-1)).all()
    with torch.no_grad():
        out = peer(input_ids=torch.from_numpy(texts["token_ids"]).long(),
                   attention_mask=torch.from_numpy(texts["padding_mask"]).long(),
                   pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2).copy()))
    peers.assert_parity(model, images, texts, out.image_embeds.numpy(), out.text_embeds.numpy(),
                        out.logits_per_image.numpy(), f"transformers MetaClip2Model {checkpoint} ({layout})")


@run_once  # argument checks and the config: nothing computed
def test_end_token_pooling_is_checked_and_saved():
    tower = TextTransformer(16, 6, 8, 1, 2, 16, pooling="eot", end_token_id=2)
    assert tower.get_config()["end_token_id"] == 2
    assert TextTransformer.from_config(tower.get_config()).end_token_id == 2
    assert "end_token_id" not in TextTransformer(16, 6, 8, 1, 2, 16).get_config()  # CLIP's largest-id pooling
    with pytest.raises(ValueError, match="end_token_id.*below `vocabulary_size` \\(16\\)"):
        TextTransformer(16, 6, 8, 1, 2, 16, end_token_id=16)
    with pytest.raises(ValueError, match="end_token_id.*pooling='mean'"):
        TextTransformer(16, 6, 8, 1, 2, 16, pooling="mean", end_token_id=2)


@run_once  # the converter's check of the config, before any backend computes
def test_a_list_of_end_tokens_is_refused_by_name(hf, torch):
    peer = _peer(hf, torch, **GEOMETRIES["facebook/metaclip-2-worldwide-b32"])
    config = peer.config.to_dict()
    config["text_config"]["eos_token_id"] = [2, 3]
    with pytest.raises(ValueError, match="eos_token_id"):
        vc.from_transformers_state_dict(peer.state_dict(), config)
