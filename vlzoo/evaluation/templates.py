"""Prompt templates for zero-shot classification.

A template is a string with one `{}` where the class name goes
(`"a photo of a {}."`), or a callable `name -> prompt`.

* `IMAGENET_TEMPLATES`: the 80 ImageNet prompts OpenAI published with CLIP
  (`notebooks/Prompt_Engineering_for_ImageNet.ipynb`), in their order.
* `SIMPLE_TEMPLATES`: the 7 of them CLIP's authors found to do as well as the
  80 on ImageNet (the same notebook; open_clip's `SIMPLE_IMAGENET_TEMPLATES`).
* `DEFAULT_TEMPLATES`: the single prompt `"a photo of a {}."`.
* `read_templates(spec)`: one of those sets by name (`TEMPLATE_SETS`), or a
  file of templates, one with `{}` a line (`vlzoo zeroshot --templates`).

Example:
>>> build_prompts(["cat", "dog"], ("a photo of a {}.", "art of the {}."))
['a photo of a cat.', 'art of the cat.', 'a photo of a dog.', 'art of the dog.']
"""

import os

__all__ = [
    "DEFAULT_TEMPLATES", "IMAGENET_TEMPLATES", "SIMPLE_TEMPLATES", "TEMPLATE_SETS", "build_prompts", "read_templates",
]

IMAGENET_TEMPLATES = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)

SIMPLE_TEMPLATES = (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)

DEFAULT_TEMPLATES = ("a photo of a {}.",)


def build_prompts(class_names, templates):
    """Every template filled with every class name, class-major.

    Args:
        class_names: sequence of `C` class names (strings).
        templates: sequence of `K` templates: strings with exactly one `{}`,
            or callables `name -> str`.

    Returns:
        A list of `C * K` prompts; prompt `c * K + k` is template `k` of class `c`.

    Raises:
        ValueError: empty `class_names` / `templates`, or a string template
            without exactly one `{}`.
        TypeError: a class name that is not a string, or a template that is
            neither a string nor callable.
    """
    if isinstance(class_names, str) or not len(class_names):
        raise ValueError(f"`class_names` must be a non-empty sequence of strings; received {class_names!r}.")
    if isinstance(templates, str) or not len(templates):
        raise ValueError(
            f"`templates` must be a non-empty sequence of templates (e.g. `(\"a photo of a {{}}.\",)`); "
            f"received {templates!r}."
        )
    for name in class_names:
        if not isinstance(name, str):
            raise TypeError(f"`class_names` must hold strings; received {type(name).__name__} {name!r}.")
    for template in templates:
        if isinstance(template, str):
            if template.count("{}") != 1:
                raise ValueError(
                    f"A string template must contain exactly one `{{}}` for the class name; received {template!r}."
                )
        elif not callable(template):
            raise TypeError(
                f"`templates` must hold strings with one `{{}}` or callables; received {type(template).__name__}."
            )
    return [
        template.format(name) if isinstance(template, str) else template(name)
        for name in class_names for template in templates
    ]


TEMPLATE_SETS = ("imagenet", "simple", "default")


def read_templates(spec):
    """Prompt templates of a set name (`TEMPLATE_SETS`) or of a file (one template with `{}` a line).

    Raises:
        ValueError: `spec` is neither a set name nor a file, or a line of the file is not a
            template with exactly one `{}`.

    Example:
    >>> read_templates("simple") == list(SIMPLE_TEMPLATES)  # doctest: +SKIP
    True
    """
    sets = {"imagenet": IMAGENET_TEMPLATES, "simple": SIMPLE_TEMPLATES, "default": DEFAULT_TEMPLATES}
    if spec in sets:
        return tuple(sets[spec])
    if not os.path.isfile(spec):
        raise ValueError(f"expected one of {', '.join(TEMPLATE_SETS)} or a template file; {spec!r} is neither")
    with open(spec, encoding="utf-8") as f:
        templates = tuple(line.rstrip("\n") for line in f if line.strip())
    bad = [t for t in templates if t.count("{}") != 1]
    if not templates or bad:
        problem = f"bad line: {bad[0]!r}" if bad else "the file is empty"
        raise ValueError(f"{spec}: every line must be a template with exactly one '{{}}' "
                         f"(e.g. 'a photo of a {{}}.'); {problem}")
    return templates
