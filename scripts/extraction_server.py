#!/usr/bin/env python
"""An extraction server for ``extract.endpoints`` (extract.mode online/hybrid), e.g. on an
inference node: the run's target with the pipeline's connector, capturing the layers the train
job of a drafter reads, writing each sample under --staging until the trainer has loaded it.
The trainer reads the path the server answers with, so --staging must be a directory the
training nodes see at the same path (a shared file system), unless the config sets
extract.transport: mooncake with extract.mooncake.master: the server then puts each sample into
that Mooncake store under this name, and nothing is written there.

    .venv/bin/python scripts/extraction_server.py --configfile my.yaml \
        --staging /shared/hs-staging [--drafter eagle3] [--host 0.0.0.0] [--port 8000] [--print]

Takes the run's config files (config/config.yaml first, as the workflow does) and needs its
target/target.json (the target stage done). Runs the server in the foreground until Ctrl-C;
--print only prints the command. Then list http://<this host>:<port>/v1 in extract.endpoints.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from eagle3_pipeline import config as cfglib
    from eagle3_pipeline.methods import layer_ids_of
    from eagle3_pipeline.online.servers import endpoint_spec
    from eagle3_pipeline.server import VllmServer
    from eagle3_pipeline.target.stage import load_info

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", nargs="*", default=[], help="the run's config files")
    ap.add_argument("--staging", required=True, help="where the server writes its samples")
    ap.add_argument("--drafter", help="the drafter whose layers to capture (default: the first)")
    ap.add_argument("--host", default="0.0.0.0", help="the address to listen on (all: 0.0.0.0)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--print", action="store_true", help="print the command, start nothing")
    args = ap.parse_args(argv)

    config = cfglib.load_files(args.configfile)
    drafter = args.drafter or config["train"]["methods"][0]
    target_json = Path(cfglib.run_dir(config)) / "target" / "target.json"
    if not target_json.is_file():
        sys.exit(f"{target_json} not found: run the target stage first (snakemake --until target)")
    own = layer_ids_of(cfglib.drafter_train_config(config, drafter))
    staging = Path(args.staging).resolve()
    spec = endpoint_spec(config["extract"], config["vllm"], load_info(target_json), own, staging)
    server = VllmServer(spec)
    command = server.argv(args.port)
    command[command.index("--host") + 1] = args.host
    print(shlex.join(command), flush=True)
    if args.print:
        return 0
    Path(args.staging).mkdir(parents=True, exist_ok=True)
    os.execve(command[0], command, server.environment())


if __name__ == "__main__":
    sys.exit(main())
