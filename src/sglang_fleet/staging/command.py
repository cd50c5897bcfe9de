"""`sglang-fleet weights manifest FOLDER`: a revision's manifest, made once where the files are,
to publish beside them for an HTTP(S) source (docs/weights.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from sglang_fleet_node import sglang_fleet_stagemanifest as mf

EXIT_USAGE = 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    weights = sub.add_parser("weights", help="staged model weights: make a revision's manifest")
    what = weights.add_subparsers(dest="weights_command", required=True)
    manifest = what.add_parser("manifest", help="print the manifest of a model folder (every "
                                                "file's size and SHA-256, and each piece's)")
    manifest.add_argument("folder", help="the revision's folder (config.json, shards, index)")
    manifest.add_argument("--name", help="the model's name (default: the folder's name)")
    manifest.add_argument("--revision", default="", help="the revision's name")
    manifest.add_argument("--piece-size", type=int, default=mf.DEFAULT_PIECE_SIZE,
                          help="bytes per piece (default %(default)s)")
    manifest.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    name = args.name or os.path.basename(os.path.abspath(args.folder))
    try:
        manifest = mf.build(args.folder, name, args.revision, args.piece_size,
                            source=f"folder {os.path.abspath(args.folder)}")
    except (OSError, mf.ManifestError) as exc:
        print(f"sglang-fleet weights manifest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    json.dump(manifest, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0
