"""One launch for the runs of several model-parallel scripts, driven by a JSON argument.

``{"devices": n, "parts": [{"script": name, "out": path, "runs": [...]}, ...]}``: each part is
``main({"devices": n, "out": ..., "runs": ...})`` of ``tests/distributed/scripts/<name>.py``
(model_parallel_train, pipeline_train, tp_transformer_train), in order, in the same ranks: starting ranks costs
seconds (a 4-process launch about 10 s on 2 cores), so the tests' runs on one world size share one launch
(tests/conftest.py). Every part writes its own ``out``, as its script alone does.
"""

from __future__ import annotations

import importlib
import json
import sys

SCRIPTS = ("model_parallel_train", "pipeline_train", "tp_transformer_train")


def main(cfg: dict) -> None:
    for part in cfg["parts"]:
        if part["script"] not in SCRIPTS:
            raise ValueError(f"Unknown script {part['script']!r}: one of {SCRIPTS}")
        script = importlib.import_module(f"tests.distributed.scripts.{part['script']}")
        script.main({"devices": cfg["devices"], "out": part["out"], "runs": part["runs"]})


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
