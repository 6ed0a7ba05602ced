"""`vlzoo export`: each tower of a preset as a serving artefact (ONNX, TensorFlow SavedModel, LiteRT)."""

from vlzoo.cli._common import UsageError, _add_command, _add_preset, _check_preset, _load_preset, _positive_int


def register(sub):
    p = _add_command(
        sub, "export", "write a preset's towers as serving artefacts (ONNX, TensorFlow SavedModel, LiteRT)",
        "Writes the image and/or text tower of --preset under --out (vlzoo.export): image.onnx /\n"
        "text.onnx, image.tflite / text.tflite, or the SavedModel folders image/ and text/, plus\n"
        "export.json (inputs, outputs and the image preprocessing). The image artefact takes\n"
        "preprocessed `images` (B, H, W, 3) float32, the text one `token_ids` and `padding_mask`\n"
        "(B, T); both return the family's normalised embeddings by name (`embeds`, and the extras\n"
        "its scores read). Each artefact is then run with its format's runtime (ONNX Runtime,\n"
        "TensorFlow, the LiteRT interpreter) on a random batch and its smallest cosine to the\n"
        "Keras model printed. The backend (KERAS_BACKEND) decides what Keras can export: TensorFlow\n"
        "all three formats; JAX the SavedModel and ONNX (through jax2onnx, in the `export` extra);\n"
        "PyTorch ONNX with a fixed --batch-size.",
        ["vlzoo export --preset clip_shapes --format onnx --out serving/clip_shapes",
         "KERAS_BACKEND=tensorflow vlzoo export --preset sparc_shapes --format litert --tower image --out serving/sparc",
         "KERAS_BACKEND=torch vlzoo export --preset clip_shapes --format onnx --batch-size 8 --out serving/clip8"],
    )
    _add_preset(p)
    p.add_argument("--format", required=True, choices=("onnx", "tf_saved_model", "litert"), help="the artefacts' format")
    p.add_argument("--tower", default="both", choices=("image", "text", "both"), help="which towers (default: both)")
    p.add_argument("--batch-size", type=_positive_int, default=None, metavar="N",
                   help="a fixed batch for the artefacts' inputs (default: any batch; PyTorch's ONNX export needs one)")
    p.add_argument("--int8", action="store_true",
                   help="onnx: also write NAME.int8.onnx, ONNX Runtime's dynamic int8 quantization of each artefact")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    p.set_defaults(func=run)


def run(args, out):
    _check_preset(args.preset)
    # heavy: imports a backend
    import keras

    from vlzoo import serving

    if args.int8 and args.format != "onnx":
        raise UsageError("--int8", f"ONNX Runtime's int8 quantizer reads ONNX artefacts, not {args.format}")
    backend = keras.backend.backend()
    why = serving.unsupported(args.format, backend, args.batch_size)
    if why:  # a fixed batch is the fix where one would do
        raise UsageError("--batch-size" if serving.unsupported(args.format, backend, 1) is None else "--format", why)
    model = _load_preset(args.preset, out, dtype="float32")
    towers = ("image", "text") if args.tower == "both" else (args.tower,)
    artefacts = serving.export(model, args.out, format=args.format, towers=towers, batch_size=args.batch_size)
    written = [artefacts]
    if args.int8:
        written.append({tower: serving.quantize_onnx(path) for tower, path in artefacts.items()})
    for paths in written:
        for tower, found in serving.parity(model, paths, batch_size=args.batch_size or 2).items():
            cosines = ", ".join(f"{name} {value:.6f}" for name, value in found.items())
            print(f"wrote {paths[tower]}: smallest cosine to the Keras model {cosines}", file=out)
    return 0
