"""Pictures of what a model aligns: per-token maps over the patch grid, as PNG files.

`alignment_maps` draws, for one image and one caption, each token's weights
over the image's patch grid as a heatmap laid over the image, one panel per
token, like the FILIP and SPARC papers' figures. The weights come from the
family: SPARC's alignment weights (`vlzoo.losses.sparc_alignment_weights`),
or FILIP's argmax matches turned into one-hot rows (`filip_match_weights`).

Example:
>>> weights = vlzoo.losses.sparc_alignment_weights(patches, tokens)[0]   # (T, P)
>>> vlzoo.viz.alignment_maps(image, ["red", "circle"], weights[1:3], "align.png")
"""

import math

import numpy as np
from keras import ops


def filip_match_weights(token_to_patch, num_patches):
    """One-hot `(T, P)` rows from FILIP's token -> best patch indices `(T,)`."""
    index = np.asarray(ops.convert_to_numpy(token_to_patch)).reshape(-1)
    weights = np.zeros((index.size, num_patches), np.float32)
    weights[np.arange(index.size), index] = 1.0
    return weights


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
