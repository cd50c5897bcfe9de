"""`sglang-fleet weights manifest FOLDER`: a revision's manifest, made once where the files are,
to publish beside them for an HTTP(S) source (docs/weights.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.runs.summary import EXIT_USAGE


def cmd_weights(args: argparse.Namespace) -> int:
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
