"""Numpy reference implementations, independent of vlzoo and of Keras.

Everything is computed in float64 from the formulas in the papers, so the
results can serve as golden values for any backend. Inputs are array-likes;
outputs are float64 numpy values.
"""

import numpy as np


def l2_normalize(x, axis=-1, epsilon=1e-12):
    """`x / max(||x||, epsilon)` (zero vectors stay zero)."""
    x = np.asarray(x, dtype=np.float64)
    norm = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
    return x / np.maximum(norm, epsilon)


def log_softmax(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def log_sigmoid(x):
    """`log(1 / (1 + exp(-x)))`, stable for large |x|."""
    return -np.logaddexp(0.0, -np.asarray(x, dtype=np.float64))


def clip_logits(image_embeds, text_embeds, logit_scale):
    """`(B_img, B_txt)`: `s * cos(image_i, text_j)`."""
    img = l2_normalize(image_embeds)
    txt = l2_normalize(text_embeds)
    return float(logit_scale) * img @ txt.T


def siglip_logits(image_embeds, text_embeds, logit_scale, logit_bias):
    """`(B_img, B_txt)`: `s * cos(image_i, text_j) + b`."""
    return clip_logits(image_embeds, text_embeds, logit_scale) + float(
        logit_bias)


def clip_loss(image_embeds, text_embeds, logit_scale):
    """`0.5 * (CE_i2t + CE_t2i)`, targets on the diagonal, batch means."""
    logits = clip_logits(image_embeds, text_embeds, logit_scale)
    n = logits.shape[0]
    i2t = -np.mean(log_softmax(logits, axis=1)[np.arange(n), np.arange(n)])
    t2i = -np.mean(log_softmax(logits.T, axis=1)[np.arange(n), np.arange(n)])
    return 0.5 * (i2t + t2i)


def siglip_loss(image_embeds, text_embeds, logit_scale, logit_bias):
    """`-(1/B) sum_ij log_sigmoid(y_ij * (s * cos_ij + b))`, `y = 2I - 1`."""
    logits = siglip_logits(image_embeds, text_embeds, logit_scale, logit_bias)
    n = logits.shape[0]
    labels = 2.0 * np.eye(n) - 1.0
    return -np.sum(log_sigmoid(labels * logits)) / n


def siglip_loss_loop(image_embeds, text_embeds, logit_scale, logit_bias):
    """The same SigLIP loss as an explicit double loop over pairs, written
    with `math` only; cross-checks `siglip_loss` itself."""
    import math

    img = l2_normalize(image_embeds)
    txt = l2_normalize(text_embeds)
    n = img.shape[0]
    total = 0.0
    for i in range(n):
        for j in range(n):
            z = float(logit_scale) * float(np.dot(img[i], txt[j])) + float(
                logit_bias)
            y = 1.0 if i == j else -1.0
            total += -math.log1p(math.exp(-y * z))  # log sigmoid(y z)
    return -total / n


def clip_loss_loop(image_embeds, text_embeds, logit_scale):
    """CLIP loss as explicit loops with `math` only."""
    import math

    img = l2_normalize(image_embeds)
    txt = l2_normalize(text_embeds)
    n = img.shape[0]
    z = [[float(logit_scale) * float(np.dot(img[i], txt[j]))
          for j in range(n)] for i in range(n)]

    def ce(row, target):
        m = max(row)
        return -(row[target] - m - math.log(sum(math.exp(v - m) for v in row)))

    i2t = sum(ce(z[i], i) for i in range(n)) / n
    t2i = sum(ce([z[j][i] for j in range(n)], i) for i in range(n)) / n
    return 0.5 * (i2t + t2i)
