#!/usr/bin/env python3
"""Checks the documentation's configuration examples against the filter's own parser.

Run by `make docs` (and so by `make test`). Three checks:

1. Every JSON block marked as a warmroute configuration passes `warmroute-check-config`, the
   core's `Config::parse`, the parser `on_configure` runs. A block is marked by an HTML comment
   on the line before its fence:

       <!-- warmroute-config -->            a whole configuration
       <!-- warmroute-config fragment -->   members of one ("gate": {...}); checked inside
                                            a configuration of one backend

2. The reference table in configuration.md and the marked examples agree: every field the
   table documents appears in some example (so the parser has accepted it), and every field an
   example sets is documented in the table. The parser rejects unknown fields, so together these
   say: documented => accepted.

3. The reverse, accepted => documented, by asking the parser: each object of the examples gets
   an unknown member, and the rejection (serde's `deny_unknown_fields`: "unknown field ...,
   expected one of `a`, `b`") lists the fields that object accepts; each must be in the table.
   This reads an error message, not an interface: if its shape changes the check fails loudly,
   and the lasting fix is a field list from the Rust side (see the end of
   docs/decisions/0001-docs-site-mkdocs.md).

The binary is $WARMROUTE_CHECK_CONFIG, else target/release/warmroute-check-config (the Makefile
builds it). Exits 1 on any failure, printing the page and line of each bad example.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
REFERENCE = DOCS / "configuration.md"
MARK = re.compile(r"^<!--\s*warmroute-config(\s+fragment)?\s*-->\s*$")
# The backend a fragment is checked with.
FRAGMENT_BASE = {"backends": [{"name": "vllm-0", "address": "10.0.0.1:8000"}]}


def examples() -> list[tuple[str, int, dict]]:
    """(page, line, config) for every marked block; a block that is not JSON is a failure."""
    found, bad = [], []
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text().split("\n")
        for i, line in enumerate(lines):
            m = MARK.match(line.strip())
            if not m:
                continue
            where = f"{page.relative_to(ROOT)}:{i + 1}"
            if i + 1 >= len(lines) or not lines[i + 1].strip().startswith("```json"):
                bad.append(f"{where}: the marker is not followed by a ```json block")
                continue
            end = next((j for j in range(i + 2, len(lines)) if lines[j].strip().startswith("```")), None)
            if end is None:
                bad.append(f"{where}: unterminated block")
                continue
            text = "\n".join(lines[i + 2:end])
            try:
                cfg = json.loads("{" + text + "}" if m.group(1) else text)
            except json.JSONDecodeError as e:
                bad.append(f"{where}: not JSON: {e}")
                continue
            if m.group(1) and "backends" not in cfg and "pool" not in cfg:
                cfg = {**FRAGMENT_BASE, **cfg}
            found.append((str(page.relative_to(ROOT)), i + 1, cfg))
    if bad:
        print("\n".join(bad))
        sys.exit(1)
    return found


# Objects whose keys are the operator's names, not fields: a leaf, never probed.
MAPS = {"gate.objectives"}


def leaf_paths(v, prefix: str = "") -> set[str]:
    """Dotted paths of the values that are not objects; an array of objects is `name[]`."""
    if isinstance(v, dict) and prefix not in MAPS:
        out = set()
        for k, x in v.items():
            out |= leaf_paths(x, f"{prefix}.{k}" if prefix else k)
        return out
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        out = set()
        for x in v:
            out |= leaf_paths(x, prefix + "[]")
        return out
    return {prefix}


def documented() -> set[str]:
    """The field names in the first column of the reference table, braces expanded."""
    names = set()
    for line in REFERENCE.read_text().split("\n"):
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        for name in re.findall(r"`([^`]+)`", first):
            m = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", name)
            if m:
                names |= {m.group(1) + part + m.group(3) for part in m.group(2).split(",")}
            else:
                names.add(name)
    return names


PROBE = "__undocumented_probe__"


def objects(v, prefix: str = ""):
    """(path, path of keys and indices) of every object in a configuration; arrays as `[]`."""
    if isinstance(v, dict) and prefix not in MAPS:
        yield prefix, []
        for k, x in v.items():
            for p, keys in objects(x, f"{prefix}.{k}" if prefix else k):
                yield p, [k] + keys
    elif isinstance(v, list) and v and isinstance(v[0], dict):
        for p, keys in objects(v[0], prefix + "[]"):
            yield p, [0] + keys


def probes(found) -> dict[str, dict]:
    """One configuration per object path, that object given the unknown member PROBE."""
    out = {}
    for _, _, cfg in found:
        for path, keys in objects(cfg):
            if path in out:
                continue
            probe = json.loads(json.dumps(cfg))
            target = probe
            for k in keys:
                target = target[k]
            target[PROBE] = 0
            out[path] = probe
    return out


def accepted(why: str) -> list[str] | None:
    """The fields serde lists in an unknown-field rejection, or None if it is not one."""
    m = re.search(r"unknown field `" + PROBE + r"`, expected (?:one of )?(.*?)(?: at line \d+|$)", why)
    return re.findall(r"`([^`]+)`", m.group(1)) if m else None


def run(binary: Path, configs: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """verdict ("ok"/"FAIL", why) per key of `configs`, from one run of the binary."""
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for n, (key, cfg) in enumerate(configs.items()):
            f = Path(tmp) / f"config-{n}.json"
            f.write_text(json.dumps(cfg))
            files[str(f)] = key
        out = subprocess.run([str(binary), *files], capture_output=True, text=True)
    verdicts = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(ok|FAIL)\s+(\S+?):\s*(.*)", line)
        if m and m.group(2) in files:
            verdicts[files[m.group(2)]] = (m.group(1), m.group(3))
    return {key: verdicts.get(key, ("FAIL", f"no verdict ({out.stderr.strip()})")) for key in configs}


def main() -> int:
    found = examples()
    binary = Path(os.environ.get("WARMROUTE_CHECK_CONFIG", ROOT / "target/release/warmroute-check-config"))
    if not binary.exists():
        print(f"{binary} missing: build it with `cargo build --release -p warmroute-core --bin warmroute-check-config`")
        return 2
    failures = 0
    for where, (verdict, why) in run(binary, {f"{p}:{l}": c for p, l, c in found}).items():
        if verdict != "ok":
            failures += 1
            print(f"FAIL {where}: {why}")
    docs = documented()
    used = set().union(*(leaf_paths(cfg) for _, _, cfg in found)) if found else set()
    fragment_only = leaf_paths(FRAGMENT_BASE)
    for name in sorted(docs):
        if not any(u == name or u.startswith(name + ".") or u.startswith(name + "[]") for u in used):
            failures += 1
            print(f"FAIL docs/configuration.md: `{name}` is documented but no checked example sets it")
    for name in sorted(used - fragment_only):
        if name not in docs:
            failures += 1
            print(f"FAIL an example sets `{name}`, which the reference table does not document")
    for path, (verdict, why) in run(binary, probes(found)).items():
        fields = accepted(why) if verdict == "FAIL" else None
        if fields is None:
            failures += 1
            print(f"FAIL cannot read the fields `{path or '(top level)'}` accepts from the parser: {verdict} {why}")
            continue
        for f in fields:
            name = f"{path}.{f}" if path else f
            if not any(d == name or d.startswith(name + ".") or d.startswith(name + "[]") for d in docs):
                failures += 1
                print(f"FAIL docs/configuration.md: the parser accepts `{name}`, which the reference table does not document")
    if failures:
        print(f"check_config_examples: {failures} failure(s)")
        return 1
    print(f"check_config_examples: {len(found)} marked examples accepted by {binary.name}; "
          f"{len(docs)} documented fields, each set by an example; every field the parser accepts is documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
