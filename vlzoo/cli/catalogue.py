"""`vlzoo list`, `vlzoo download` and `vlzoo info`: the preset catalogue."""

import json

from vlzoo.cli._common import _add_command, _format_params
from vlzoo.presets import catalogue


def register(sub):
    p = _add_command(sub, "list", "table of registered presets",
                     "Print every registered preset: name, family, parameter count\n"
                     "(computed without allocating weights) and whether weights are bundled;\n"
                     "with --pretrained, the presets of real public weights instead.",
                     ["vlzoo list", "vlzoo list --family siglip", "vlzoo list --pretrained"])
    p.add_argument("--family", default=None, metavar="F",
                   help="only presets of this family, e.g. clip or siglip (default: all)")
    p.add_argument("--pretrained", action="store_true",
                   help="list the pretrained presets: their source, licence and download size")
    p.set_defaults(func=run, loads_frameworks=False)

    p = _add_command(sub, "download", "fetch and convert weights into the cache",
                     "Download a pretrained preset or a hub handle, check every file, convert it\n"
                     "to a vlzoo preset in the cache and print where; later loads need no network\n"
                     "(HF_HUB_OFFLINE=1 works).",
                     ["vlzoo download clip_vit_b16_openai", "vlzoo download hf://openai/clip-vit-base-patch32"])
    p.add_argument("handle", metavar="NAME_OR_HANDLE",
                   help="a pretrained preset (see `vlzoo list --pretrained`), hf://org/name[@revision] or "
                   "kaggle://owner/model/framework/variation[/version]")
    p.set_defaults(func=run)

    p = _add_command(sub, "info", "details of one preset",
                     "Print vlzoo.preset_info(NAME) as JSON: name, family, params, paper,\n"
                     "weights_available, description, directory.",
                     ["vlzoo info clip_vit_b16", "vlzoo info ./my_preset"])
    p.add_argument("name", metavar="NAME", help="a registered preset name or a preset directory")
    p.set_defaults(func=run, loads_frameworks=False)


def run(args, out):
    return {"list": _list, "download": _download, "info": _info}[args.command](args, out)


def _list(args, out):
    # No backend is imported: registered presets carry their parameter count in their metadata.
    if args.pretrained:
        rows = [("name", "family", "params", "download", "licence", "source")]
    else:
        rows = [("name", "family", "params", "weights")]
    for name in catalogue.list_presets(family=args.family, pretrained=args.pretrained):
        info = catalogue.describe(name)
        params = "-" if info["params"] is None else f"{info['params']:,} ({_format_params(info['params'])})"
        if args.pretrained:
            rows.append((name, info["family"], params, info["download_size"] or "not stated", info["licence"],
                         info["handle"]))
        else:
            rows.append((name, str(info["family"]), params, "yes" if info["weights_available"] else "no"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for j, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=out)
    return 0


def _download(args, out):
    from vlzoo.presets import remote  # imports a backend: the download converts the weights

    directory = remote.local_directory(args.handle)
    print(f"{args.handle}: ready in {directory}", file=out)
    return 0


def _info(args, out):
    info = catalogue.describe(args.name)
    if info["params"] is None:  # a directory: counted from its config, with Keras
        from vlzoo.presets import local

        info = local.preset_info(args.name)
    print(json.dumps(info, indent=2), file=out)
    return 0
