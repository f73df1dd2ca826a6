#!/usr/bin/env python3
"""The core's rooms import only the rooms below them (docs: architecture).

    python3 scripts/check_rooms.py          # exit 1 and name each import that breaks the plan

A room is a folder of filter/core/src (config, prompt, fleet, routing, gate,
worker); the files at its top are the foundation. Every `crate::<room>` path in
code (comments are prose, not imports) must name the file's own room or one the
table below allows. Test files and test support may import anything a room may,
plus the test support itself.
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "filter" / "core" / "src"
FOUNDATION = {"host", "codec", "hash", "phases"}
# What each room may import besides itself and the foundation.
ALLOWED = {
    "foundation": set(),
    "config": set(),
    "prompt": {"config"},
    "fleet": {"config"},
    "gate": {"config"},
    "routing": {"config", "prompt", "fleet"},
    "worker": {"config", "prompt", "fleet", "routing", "gate"},
    # Test support (`testing.rs`, built for tests only) builds any room's inputs.
    "testing": {"config", "prompt", "fleet", "routing", "gate", "worker"},
}
PATH = re.compile(r"\bcrate::([a-z_]+)")
# `use crate::{fleet::x, routing::y}`: every path of the group names its room.
GROUP = re.compile(r"\bcrate::\{([^}]*)\}")
SEGMENT = re.compile(r"(?:^|,)\s*([a-z_]+)")


def targets(code: str) -> list[tuple[int, str]]:
    """(line, room or foundation module) for every `crate::` path in `code`, groups included
    (a group may span lines)."""
    line = lambda at: code.count("\n", 0, at) + 1
    found = [(line(m.start()), m.group(1)) for m in PATH.finditer(code)]
    for g in GROUP.finditer(code):
        found += [(line(g.start()), seg) for seg in SEGMENT.findall(g.group(1))]
    return found


def room_of(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC)
    if rel.parts == ("testing.rs",):
        return "testing"
    if len(rel.parts) == 1:
        return "foundation"
    return rel.parts[0] if rel.parts[0] in ALLOWED else "foundation"


def main() -> int:
    broken = []
    for path in sorted(SRC.rglob("*.rs")):
        if "bin" in path.relative_to(SRC).parts:
            continue
        room = room_of(path)
        ok = ALLOWED[room] | {room} | FOUNDATION | {"testing"}
        code = "\n".join(line.split("//", 1)[0] for line in path.read_text().splitlines())
        for n, target in targets(code):
            if target in ALLOWED and target not in ok:
                broken.append(f"{path.relative_to(SRC)}:{n}: {room} imports {target}")
    for b in broken:
        print(b)
    rooms = ", ".join(r for r in ALLOWED if r not in ("foundation", "testing"))
    print(f"rooms ({rooms}): {'plan broken' if broken else 'each imports only the rooms below it'}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
