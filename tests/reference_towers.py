"""Independent numpy forward passes of the towers (weights read from the Keras layers).

Written from the papers' and open_clip's definitions, not from vlzoo's code, so a
wrong epsilon, activation, mask, pooling or LayerNorm placement in vlzoo shows up
as a difference.
"""

import math

import keras
import numpy as np
from scipy.special import erf


def w(variable):
    return keras.ops.convert_to_numpy(variable).astype(np.float64)


def layer_norm(x, layer):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + layer.epsilon) * w(layer.gamma) + w(layer.beta)


def activation(x, name):
    if name == "quick_gelu":
        return x / (1 + np.exp(-1.702 * x))
    if name == "gelu":
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    raise ValueError(name)


def dense(x, layer):
    y = x @ w(layer.kernel)
    return y + w(layer.bias) if layer.use_bias else y


def attention(x, context, layer, mask=None):
    """`mask`: bool (B, N, M), True = may attend."""
    b, n, d = x.shape
    m, h = context.shape[1], layer.num_heads
    q = dense(x, layer.query).reshape(b, n, h, d // h).transpose(0, 2, 1, 3)
    k = dense(context, layer.key).reshape(b, m, h, d // h).transpose(0, 2, 1, 3)
    v = dense(context, layer.value).reshape(b, m, h, d // h).transpose(0, 2, 1, 3)
    logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // h)
    if mask is not None:
        logits = np.where(mask[:, None], logits, -1e30)
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(-1, keepdims=True)
    out = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
    return dense(out, layer.output_dense)


def mlp(x, layer):
    return dense(activation(dense(x, layer.fc1), layer.activation), layer.fc2)


def block(x, layer, mask=None):
    x = x + attention(layer_norm(x, layer.ln_1), layer_norm(x, layer.ln_1), layer.attention, mask)
    return x + mlp(layer_norm(x, layer.ln_2), layer.mlp)


def vision_forward(images, vit):
    """Returns (pooled, tokens) of a `VisionTransformer` at its own resolution."""
    images = images.astype(np.float64)
    b, hgt, wid, c = images.shape
    p = vit.patch_size
    gh, gw = hgt // p, wid // p
    patches = images.reshape(b, gh, p, gw, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, gh * gw, p * p * c)
    x = patches @ w(vit.patch_embedding.conv.kernel).reshape(p * p * c, -1)
    if vit.patch_bias:
        x = x + w(vit.patch_embedding.conv.bias)
    if vit.num_prefix_tokens:
        prefix = np.broadcast_to(w(vit.prefix_tokens), (b,) + tuple(vit.prefix_tokens.shape))
        x = np.concatenate([prefix, x], axis=1)
    x = x + w(vit.position_embedding.embeddings)
    if vit.use_pre_norm:
        x = layer_norm(x, vit.pre_norm)
    for layer in vit.blocks:
        x = block(x, layer)
    tokens = layer_norm(x, vit.post_norm)
    if vit.pooling == "cls":
        pooled = tokens[:, 0]
    elif vit.pooling == "mean":
        pooled = tokens[:, vit.num_prefix_tokens :].mean(1)
    else:
        head = vit.map_head
        query = np.broadcast_to(w(head.latent), (b, 1, vit.hidden_dim))
        y = attention(query, tokens, head.attention)
        y = y + mlp(layer_norm(y, head.norm), head.mlp)
        pooled = y[:, 0]
    if vit.projection is not None:
        pooled = dense(pooled, vit.projection)
    return pooled, tokens


def text_forward(token_ids, padding_mask, tower):
    """Returns (pooled, tokens) of a `TextTransformer`."""
    b, t = token_ids.shape
    x = w(tower.token_embedding.embeddings)[token_ids] + w(tower.position_embedding.embeddings)[:t]
    mask = np.ones((b, t, t), bool)
    if tower.causal:
        mask &= np.tril(np.ones((t, t), bool))[None]
    if tower.use_padding_mask:
        mask &= padding_mask[:, None, :]
    for layer in tower.blocks:
        x = block(x, layer, mask)
    tokens = layer_norm(x, tower.post_norm)
    if tower.pooling == "eot":
        pooled = tokens[np.arange(b), token_ids.argmax(-1)]
    elif tower.pooling == "last":
        pooled = tokens[:, -1]
    elif tower.pooling == "first":
        pooled = tokens[:, 0]
    else:
        m = padding_mask[..., None].astype(np.float64)
        pooled = (tokens * m).sum(1) / np.maximum(m.sum(1), 1)
    if tower.projection is not None:
        pooled = dense(pooled, tower.projection)
    return pooled, tokens
