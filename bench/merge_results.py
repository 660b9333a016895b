"""Merge the e2k results of several VM boots into one document for the report:

    python -m bench.merge_results OUT.json IN1.json IN2.json ...

Each size keeps the machine line of the boot it ran in (`machine`), the document the first's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.common import write_json


def main(argv: list[str]) -> int:
    out, *ins = argv
    docs = [json.loads(Path(p).read_text()) for p in ins]
    sizes = []
    for d in docs:
        for s in d.get("result", {}).get("sizes", []):
            sizes.append(s | {"machine": d["machine"]})
    merged = dict(docs[0])
    merged["result"] = dict(docs[0].get("result", {})) | {"sizes": sizes}
    merged["boots"] = [d["machine"] for d in docs]
    write_json(Path(out), merged)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
