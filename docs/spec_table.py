"""Rewrite the table of the cluster spec's keys, in every page that holds one, from the code.

    PYTHONPATH=. python3 docs/spec_table.py          # make readme-spec

The table sits between `<!-- spec table: ... -->` and `<!-- end of spec table -->` in README.md or
a page of docs/; its text is `python -m app topology --format doc` (tests/unit/test_topology.py
fails while a page's copy is stale).
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = re.compile(r"(<!-- spec table:[^\n]*-->\n).*?(\n<!-- end of spec table -->)", flags=re.S)


def main() -> int:
    doc = [sys.executable, "-m", "app", "topology", "--format", "doc"]
    table = subprocess.run(doc, check=True, capture_output=True, text=True, cwd=ROOT).stdout.rstrip()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    rewritten = []
    for page in pages:
        text = page.read_text()
        if not TABLE.search(text):
            continue
        new = TABLE.sub(lambda m: m[1] + table + m[2], text)
        if new != text:
            page.write_text(new)
        rewritten.append(page.relative_to(ROOT).as_posix())
    if not rewritten:
        print("error: no page holds a '<!-- spec table: -->' marker; add one to README.md or docs/", file=sys.stderr)
        return 1
    print(f"spec table: {', '.join(rewritten)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
