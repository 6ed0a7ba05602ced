"""Pictures of what a model aligns: per-token maps over the patch grid, as PNG files.

`alignment_maps` draws, for one image and one caption, each token's weights
over the image's patch grid as a heatmap laid over the image, one panel per
token, like the FILIP and SPARC papers' figures. The weights come from the
family: SPARC's alignment weights (`vlzoo.losses.sparc_alignment_weights`),
or FILIP's argmax matches turned into one-hot rows; a model gives them with
`token_patch_alignment`.

`draw_caption_alignment(model, image, caption, path)` does both steps for
a SPARC or FILIP model.

`top_terms_chart` draws a STAIR sparse embedding's heaviest vocabulary terms
as a labelled bar chart (beside the image), `draw_image_terms` straight from
a STAIR model.

Example:
>>> vlzoo.viz.draw_caption_alignment(model, image, "a red circle", "align.png")
>>> weights = vlzoo.losses.sparc_alignment_weights(patches, tokens)[0]   # (T, P)
>>> vlzoo.viz.alignment_maps(image, ["red", "circle"], weights[1:3], "align.png")
"""

import math

import numpy as np
from keras import ops


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

    >>> vlzoo.viz.draw_caption_alignment(model, image, "a red circle", "align.png")
    """
    tokens, weights = caption_alignment(model, image, caption)
    return alignment_maps(image, tokens, weights, path, title=kwargs.pop("title", caption), **kwargs)


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, figure, path, title):
    if title:
        figure.suptitle(title, fontsize=10)
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


def alignment_maps(image, tokens, weights, path, grid_size=None, title=None, columns=4):
    """Writes a PNG grid: the image, then one heatmap panel per token.

    Args:
        image: `(H, W, 3)` uint8, float or preprocessed pixels (rescaled to
            [0, 1] for display).
        tokens: `T` token strings, the panel titles.
        weights: `(T, P)` alignment weights of each token over the patches
            (rows need not sum to 1; each panel is scaled to its own max).
        path: PNG file to write.
        grid_size: `(gh, gw)` with `gh * gw = P`; a square grid by default.
        title: optional figure title (e.g. the caption).
        columns: panels per row.

    Returns:
        `path`.
    """
    plt = _pyplot()
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
    panels = len(tokens) + 1
    rows = math.ceil(panels / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(2.2 * columns, 2.4 * rows), squeeze=False)
    for axis in axes.ravel():
        axis.axis("off")
    axes[0, 0].imshow(picture)
    axes[0, 0].set_title("image", fontsize=9)
    extent = (0, picture.shape[1], picture.shape[0], 0)
    for k, (token, row) in enumerate(zip(tokens, weights), start=1):
        axis = axes.ravel()[k]
        heat = row.reshape(grid_size)
        heat = heat / heat.max() if heat.max() > 0 else heat
        axis.imshow(picture)
        axis.imshow(heat, cmap="inferno", alpha=0.6, extent=extent, interpolation="nearest", vmin=0, vmax=1)
        axis.set_title(token, fontsize=9)
    return _save(plt, figure, path, title)


def top_terms_chart(terms, path, image=None, title=None):
    """Writes a PNG bar chart of sparse-embedding terms, heaviest on top, beside `image` when given.

    Args:
        terms: `[(token, weight), ...]` (e.g. one row of
            `vlzoo.retrieval.top_terms`, or `model.encode_image(x, top_k=20)[0]`).
        path: PNG file to write.
        image: optional `(H, W, 3)` image drawn on the left (rescaled to [0, 1]).
        title: optional figure title.

    Returns:
        `path`.

    Example:
    >>> vlzoo.viz.top_terms_chart([("dog", 2.1), ("beach", 1.4)], "terms.png")
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

    >>> vlzoo.viz.draw_image_terms(model, image, "terms.png", k=10)
    """
    images = ops.convert_to_tensor(np.asarray(ops.convert_to_numpy(image), np.float32)[None])
    return top_terms_chart(model.encode_image(images, top_k=k)[0], path, image=image, title=title)
