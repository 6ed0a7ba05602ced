"""What the recipes share: the model check, the towers' names, and a new model of another's config (for
the recipes that build one from two, WiSE-FT, or merge one, LoRA)."""

import keras

from vlzoo.models.base import ContrastiveModel

TOWERS = {"image": "vision", "text": "text"}  # a recipe's tower name -> the model's attribute


def check_model(model, name="model"):
    """`model` when it is a vlzoo model; a `TypeError` naming the argument otherwise."""
    if not isinstance(model, ContrastiveModel):
        raise TypeError(f"`{name}` must be a vlzoo model (a ContrastiveModel); received {type(model).__name__}.")
    return model


def tower_layer(model, tower):
    """`model`'s image (`vision`) or text tower for the name `"image"` or `"text"`, after `check_model`."""
    check_model(model)
    if tower not in TOWERS:
        raise ValueError(f"`tower` must be one of {list(TOWERS)}; received {tower!r}.")
    return getattr(model, TOWERS[tower])


def blank_copy(model, **config_overrides):
    """A new, built model of `model`'s config (its compile state aside; `config_overrides` replace
    entries), with freshly initialised weights and `model`'s tokenizer and preprocessor."""
    config = keras.saving.serialize_keras_object(model)
    config.pop("compile_config", None)  # the copy is compiled by its user, if trained
    config["config"].update(config_overrides)
    copy = keras.saving.deserialize_keras_object(config)
    copy.tokenizer, copy.preprocessor = model.tokenizer, model.preprocessor
    return copy
