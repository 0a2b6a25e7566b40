"""Parse a ``vllm serve`` argument list with vLLM's own parser and say what it made of it, as JSON.

Run with the vLLM virtualenv's python (the parser is vLLM's code); argv after this script's name is the list to
check, exactly as a container's ``command:``/``args:`` give it to the image's ``vllm serve`` entry point::

    $VLLM_VENV/bin/python testbed/vllm_venv/serve_args.py MODEL --max-num-seqs 256 ...

Prints ``{"model_tag": ..., "model": ..., "deprecated": [...], "options": {...}}`` and exits 0, or exits 2 with
argparse's own message when an option is unknown or a value does not parse. Imports nothing from sweetspot.
"""

from __future__ import annotations

import json
import logging
import sys


def main(argv: list[str]) -> int:
    logging.disable(logging.WARNING)  # vLLM logs its platform probing; only the parse result matters here
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    parser = ServeSubcommand().subparser_init(root.add_subparsers(dest="subparser"))
    args = parser.parse_args(argv)  # exits 2 with argparse's message on an unknown option
    deprecated = sorted(
        {
            action.dest
            for action in getattr(parser, "_deprecated", ())
            if getattr(args, action.dest, action.default) != action.default
        }
    )
    options = {key: value for key, value in vars(args).items() if isinstance(value, (str, int, float, bool))}
    model_tag = getattr(args, "model_tag", None)
    model = model_tag if model_tag is not None else args.model  # what `vllm serve` itself does with the two
    print(json.dumps({"model_tag": model_tag, "model": model, "deprecated": deprecated, "options": options}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
