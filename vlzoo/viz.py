"""Pictures of what a model aligns, as PNG files.

`alignment_maps` draws each token's weights over the image's patch grid (one panel per token, as
in the FILIP and SPARC papers' figures); `draw_caption_alignment` does it from a SPARC or FILIP
model (`caption_alignment`), `draw_word_maps` per word from the map `vlzoo.evaluation.grounding`
scores. `top_terms_chart` and `draw_image_terms` draw a STAIR embedding's heaviest terms.

Example:
>>> vlzoo.viz.draw_caption_alignment(model, image, "a red circle", "align.png")  # doctest: +SKIP
'align.png'
>>> weights = vlzoo.losses.sparc_alignment_weights(patches, tokens)[0]  # (T, P)  # doctest: +SKIP
>>> vlzoo.viz.alignment_maps(image, ["red", "circle"], weights[1:3], "align.png")  # doctest: +SKIP
'align.png'
"""

import math

import numpy as np
from keras import ops

from vlzoo.evaluation.grounding import word_maps
from vlzoo.retrieval import top_terms


def caption_alignment(model, image, caption):
    """Each real token of `caption` and its weights over `image`'s patch grid.

    Args:
        model: a SPARC model (its sparse alignment weights) or a FILIP model
            (its token -> best patch matches, one-hot).
        image: `(H, W, 3)` preprocessed pixels.
        caption: a string, tokenized by `model.tokenizer`.

    Returns:
        `(tokens, weights)`: the `T` real token strings (start and end tokens
        included) and float32 `(T, P)` weights.

    Raises:
        TypeError: `model` has no token-to-patch alignment.

    Example:
    >>> tokens, weights = caption_alignment(sparc, pixels[0], "a red circle")  # doctest: +SKIP
    >>> tokens, weights.shape  # doctest: +SKIP
    (['<|startoftext|>', 'a', 'red', 'circle', '<|endoftext|>'], (5, P))
    """
    inputs = model.tokenizer([caption])
    images = ops.convert_to_tensor(np.asarray(image, np.float32)[None])
    if not model.has_token_alignment:
        raise TypeError(
            f"`model` must be a token-level family with token-to-patch alignment (SPARC, FILIP); "
            f"received {type(model).__name__}."
        )
    weights = np.asarray(ops.convert_to_numpy(model.token_patch_alignment(images, inputs)))[0]
    ids = np.asarray(ops.convert_to_numpy(inputs["token_ids"]))[0]
    length = int(np.asarray(ops.convert_to_numpy(inputs["padding_mask"]))[0].sum())
    tokenizer = model.tokenizer
    tokens = [tokenizer.id_to_token(int(i)).replace("</w>", "") for i in ids[:length]]
    return tokens, weights[:length]


def draw_caption_alignment(model, image, caption, path, **kwargs):
    """`caption_alignment` drawn by `alignment_maps` (the caption as title); returns `path`.

    Raises:
        TypeError: as `caption_alignment`; ValueError: as `alignment_maps`.

    >>> vlzoo.viz.draw_caption_alignment(model, image, "a red circle", "align.png")  # doctest: +SKIP
    'align.png'
    """
    tokens, weights = caption_alignment(model, image, caption)
    return alignment_maps(image, tokens, weights, path, title=kwargs.pop("title", caption), **kwargs)


def draw_word_maps(model, image, caption, path, method=None, **kwargs):
    """Each word of `caption` and its map over `image`'s patches (`vlzoo.evaluation.grounding.word_maps`),
    drawn by `alignment_maps` (the caption and the map's method as title); returns `path`.

    Args:
        model: a model with a word map (FILIP, SPARC, FLAIR, CLIP; `grounding.grounding_method`).
        image: `(H, W, 3)` preprocessed pixels.
        caption: a string; its words are whitespace-separated.
        path: PNG file to write.
        method: None (the family's own map) or one the model has, e.g. FLAIR's `"patch_text_cosine"`.

    Raises:
        `grounding.word_maps`' errors (NotImplementedError for a family without word maps);
        ValueError: as `alignment_maps`.

    >>> vlzoo.viz.draw_word_maps(model, image, "a red circle above a blue square", "words.png")  # doctest: +SKIP
    'words.png'
    """
    maps, method = word_maps(model, np.asarray(ops.convert_to_numpy(image), np.float32)[None], [caption],
                             method=method)
    words = caption.split()
    title = kwargs.pop("title", f"{caption} ({method.replace('_', ' ')})")
    return alignment_maps(image, words, maps[0, :len(words)], path, title=title, **kwargs)


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, figure, path, title):
    if title:
        figure.suptitle(title, fontsize=10)
    if figure.get_layout_engine() is None:  # a figure made with layout="constrained" lays itself out
        figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


def _display_image(image):
    image = np.asarray(ops.convert_to_numpy(image), np.float32)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"`image` must have shape (H, W, 3); received {image.shape}.")
    low, high = float(image.min()), float(image.max())
    return (image - low) / (high - low) if high > low else np.zeros_like(image)


# Panels are drawn at least this many pixels on a side (a 32-pixel image is scaled up, pixels kept sharp).
_PANEL_PIXELS = 128
# The weights are smoothed with a Gaussian of this width in patches: a word's weight spread over an object's
# patches reads as one blob, a lone patch above its neighbours fades.
_SMOOTHING_PATCHES = 0.7
# Strongest overlay opacity; under the overlay the image is darkened, so the bright colours are the weights.
_MAX_ALPHA = 0.9


def _upsample(grid, size, smoothing, outside):
    """`grid` `(gh, gw)` to `size` `(H, W)`: each pixel takes its patch's value, then a Gaussian blur of
    `smoothing` patches that reads `outside` beyond the image's edges (no patch there picks anything,
    so a lone patch at an edge does not outshine one inside)."""
    from scipy import ndimage

    rows = np.arange(size[0]) * grid.shape[0] // size[0]
    columns = np.arange(size[1]) * grid.shape[1] // size[1]
    heat = grid[rows][:, columns]
    sigma = (smoothing * size[0] / grid.shape[0], smoothing * size[1] / grid.shape[1])
    return ndimage.gaussian_filter(heat, sigma, mode="constant", cval=outside) if smoothing else heat


def alignment_maps(image, tokens, weights, path, grid_size=None, title=None, columns=4):
    """Writes a PNG grid: the image, then one panel per token showing the patches it picks.

    Each token's weights are spread from the patch grid to the image's pixels (nearest patch, then a
    Gaussian blur of `_SMOOTHING_PATCHES` patches) and laid over a darkened copy of the image in one
    colour scale shared by every panel (the colour bar, in weight units): a weight at or below the
    uniform `1 / P` is transparent, the largest weight of the figure is opaque; the overlay's opacity grows
    with the weight. Weak tokens stay dark, next to strong ones.

    Args:
        image: `(H, W, 3)` uint8, float or preprocessed pixels (rescaled to
            [0, 1] for display).
        tokens: `T` token strings, the panel titles.
        weights: `(T, P)` alignment weights of each token over the patches
            (rows need not sum to 1; all panels share one scale).
        path: PNG file to write.
        grid_size: `(gh, gw)` with `gh * gw = P`; a square grid by default.
        title: optional figure title (e.g. the caption).
        columns: panels per row.

    Returns:
        `path`.

    Raises:
        ValueError: `weights` not `(T, P)` with `T = len(tokens)`, `grid_size` not holding `P`
            patches, or `image` not `(H, W, 3)`.

    Example:
    >>> alignment_maps(np.zeros((32, 32, 3)), ["red", "circle"], np.full((2, 16), 1 / 16),
    ...                "align.png")  # doctest: +SKIP
    'align.png'
    """
    plt = _pyplot()
    from matplotlib import cm, colors

    weights = np.asarray(ops.convert_to_numpy(weights), np.float32)
    if weights.ndim != 2 or weights.shape[0] != len(tokens):
        raise ValueError(
            f"`weights` must have shape (T, P) with T = len(tokens) = {len(tokens)}; "
            f"received {weights.shape}."
        )
    num_patches = weights.shape[1]
    if grid_size is None:
        side = int(round(math.sqrt(num_patches)))
        grid_size = (side, side)
    if grid_size[0] * grid_size[1] != num_patches:
        raise ValueError(f"`grid_size` {tuple(grid_size)} does not hold P = {num_patches} patches.")
    picture = _display_image(image)
    scale = max(1, math.ceil(_PANEL_PIXELS / max(picture.shape[:2])))
    size = (picture.shape[0] * scale, picture.shape[1] * scale)
    picture = np.repeat(np.repeat(picture, scale, axis=0), scale, axis=1)  # sharp pixels, the heat's size
    # One scale for the figure, from "no preference" to its largest weight. Rows that sum to 1 (SPARC's
    # weights, FILIP's one-hot matches) start at the uniform 1 / P; other weights at 0 (or their minimum).
    sums = weights.sum(axis=1)
    uniform = bool(weights.size) and weights.min() >= 0 and np.allclose(sums[sums > 0], 1.0, atol=1e-3)
    low = 1.0 / num_patches if uniform else min(float(weights.min()) if weights.size else 0.0, 0.0)
    heats = np.zeros((len(tokens),) + size, np.float32)
    for heat, row in zip(heats, weights):
        heat[:] = _upsample(row.reshape(grid_size), size, _SMOOTHING_PATCHES, outside=low)
    high = float(heats.max()) if heats.size and heats.max() > low else low + 1.0
    norm = colors.Normalize(vmin=low, vmax=high, clip=True)
    colormap = plt.get_cmap("inferno")
    under = 0.25 * picture  # the image darkened: what no weight lights up stays dark

    panels = len(tokens) + 1
    rows = math.ceil(panels / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(2.2 * columns + 0.8, 2.4 * rows), squeeze=False,
                                layout="constrained")
    for axis in axes.ravel():
        axis.axis("off")
    axes[0, 0].imshow(picture, interpolation="nearest")
    axes[0, 0].set_title("image", fontsize=9)
    for k, (token, heat) in enumerate(zip(tokens, heats), start=1):
        axis = axes.ravel()[k]
        level = norm(heat).filled(0)[..., None]  # 0 at the uniform weight, 1 at the figure's largest
        alpha = _MAX_ALPHA * level
        axis.imshow(under * (1 - alpha) + colormap(level[..., 0])[..., :3] * alpha, interpolation="nearest")
        axis.set_title(token, fontsize=9)
    bar = figure.colorbar(cm.ScalarMappable(norm=norm, cmap=colormap), ax=axes.ravel().tolist(), shrink=0.5,
                          aspect=30, pad=0.02)
    bar.set_label("weight, smoothed" + (f" (bottom: uniform, 1/P = 1/{num_patches})" if uniform else ""),
                  fontsize=8)
    bar.ax.tick_params(labelsize=7)
    return _save(plt, figure, path, title)


def top_terms_chart(terms, path, image=None, title=None):
    """Writes a PNG bar chart of sparse-embedding terms, heaviest on top, beside `image` when given.

    Args:
        terms: `[(token, weight), ...]`, e.g. one row of
            `vlzoo.retrieval.top_terms(model.encode_image(x)["embeds"], k=20, tokenizer=model.tokenizer)`.
        path: PNG file to write.
        image: optional `(H, W, 3)` image drawn on the left (rescaled to [0, 1]).
        title: optional figure title.

    Returns:
        `path`.

    Raises:
        ValueError: `terms` empty or not pairs; `image` not `(H, W, 3)`.

    Example:
    >>> vlzoo.viz.top_terms_chart([("dog", 2.1), ("beach", 1.4)], "terms.png")  # doctest: +SKIP
    'terms.png'
    """
    plt = _pyplot()
    if not terms or any(len(term) != 2 for term in terms):
        raise ValueError(f"`terms` must be a non-empty list of (token, weight) pairs; received {terms!r:.80}.")
    labels = [str(token) for token, _ in terms]
    weights = np.asarray([float(weight) for _, weight in terms], np.float32)
    panels = 2 if image is not None else 1
    figure, axes = plt.subplots(1, panels, figsize=(3.0 * panels + 1.0, 0.3 * len(terms) + 1.2), squeeze=False)
    if image is not None:
        axes[0, 0].imshow(_display_image(image))
        axes[0, 0].axis("off")
    bars = axes[0, -1]
    positions = np.arange(len(terms))
    bars.barh(positions, weights, color="tab:blue")
    bars.set_yticks(positions, labels, fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("weight", fontsize=8)
    for y, weight in zip(positions, weights):
        bars.text(weight, y, f" {weight:.2f}", va="center", fontsize=7)
    bars.set_xlim(0, max(float(weights.max()), 1e-6) * 1.2)
    return _save(plt, figure, path, title)


def draw_image_terms(model, image, path, k=20, title=None):
    """A STAIR model's `k` heaviest terms for `image` (`(H, W, 3)` preprocessed pixels) as
    `top_terms_chart` beside the image; returns `path`.

    >>> vlzoo.viz.draw_image_terms(model, image, "terms.png", k=10)  # doctest: +SKIP
    """
    images = ops.convert_to_tensor(np.asarray(ops.convert_to_numpy(image), np.float32)[None])
    terms = top_terms(model.encode_image(images)["embeds"], k=k, tokenizer=model.tokenizer)[0]
    return top_terms_chart(terms, path, image=image, title=title)
