#!/usr/bin/env python3
"""The user-facing docs against the binary and the measurements (python3 standard library only).

  /usr/bin/python3 tests/docs/test_docs.py --adjsh build/cli/adjsh

Checks, each a PASS/FAIL line (`N passed, N failed` at the end; exit 1 on any failure):

1. docs/USAGE.md against `adjsh <command> --help`, per command. A level-2 section covers the
   commands named in backticks in its heading (`## \\`adjsh train\\``; a shared table such as
   `## Job flags (\\`train\\`, \\`submit\\`)` covers both). The flags a --help prints are those of
   its flag list (lines `  --name ...`, the argparse `  -h, --help` form included; `--help`
   itself is documented once, not per command); `adjsh tokenizer` is the union of
   `tokenizer encode --help` and `tokenizer decode --help`.
   a. every command `adjsh --help` lists has a section;
   b. every flag a command's --help prints is a row of a flags table (first cell) in a section
      covering that command;
   c. every flag in a table's first cell is printed by every command its section covers, and
      every other `--flag` written in the section by at least one of them: a section names
      no flag its commands do not take (other tools' flags have no place in these sections);
   d. where --help prints `[default: X]`, the row's default cell holds X.
2. Every `--flag` written anywhere in README.md, docs/USAGE.md and docs/OPERATIONS.md (code
   blocks included) is printed by some adjsh --help, or is one of OTHER_TOOL_FLAGS: another
   tool's flag, and for this repository's scripts the script must contain it.
3. Figures. Measured figures must be quoted from docs/BENCHMARKS.md exactly as written there
   (the same digits, commas and decimals). What counts as a measured figure, so that version
   numbers, defaults, ports, limits and example values are left alone:
   a. every number in README.md's headline table (between `<!-- figures:begin -->` and
      `<!-- figures:end -->`, link targets left out), which must hold at least 8 rows: the
      whole table is measurements, so all its numbers (T, D, K included) must occur in
      BENCHMARKS as number tokens;
   b. in README.md, docs/USAGE.md and docs/OPERATIONS.md (the headline table included; code
      blocks and inline code left out), every number written directly before a unit of
      measurement: tokens/s, KiB/token, B/token, bytes/token, KiB, MiB, GiB, %, or a ratio
      `NNx` (`20.4x PyTorch`); both ends of a range (`1.64x-1.71x`). A setting with such a unit
      is written as inline code (`256` MiB, `--kept-mib 256`) and so is not taken for a
      measurement. Such a figure must occur in BENCHMARKS with the same unit: written with it
      (`5.89 KiB`, `18.6x`), or in a table column whose header names the unit (12814 under
      "adjsh tokens/s", 843.4 under "worker peak MiB"). So 690 tokens/s passes and "690
      KiB/token" fails, although 690 occurs in BENCHMARKS.
   What the checks cannot tell: which row a figure was taken from (12814 tokens/s at T = 4096
   quoted as T = 16384's would pass). They fail on any figure that was rounded, recomputed,
   mistyped, given the wrong unit or dropped from BENCHMARKS, which is what drifts.
4. Every relative link in the three docs points to an existing file, and an `#anchor` into a
   .md file to one of its headings (GitHub's slugs).
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import Results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md", "docs/USAGE.md", "docs/OPERATIONS.md"]

# Flags of other tools the docs may write, and where they belong. A path: this repository's
# script, which must contain the flag; anything else names an external tool.
OTHER_TOOL_FLAGS = {
    "--build": "docker compose up",
    "--build-arg": "docker build",
    "--network": "docker build",
    "--storage-driver": "dockerd",
    "--iptables": "dockerd",
    "--bridge": "dockerd",
    "--variant": "debootstrap",
    "--profile": "docker compose",
    "--test-dir": "ctest",
    "--output-on-failure": "ctest",
    "--minutes": "scripts/fuzz.sh",
    "--seconds": "scripts/fuzz.sh",
    "--quick": "scripts/gpu-check.sh",
    "--plan": "scripts/gpu-check.sh",
    "--bundle": "scripts/gpu-check.sh",
    "--prebuilt": "scripts/gpu-check.sh",
    "--rehearse": "scripts/gpu-check.sh",
    "--secret": "docker build",
    "--full-build": "tests/deploy/test_images.py",
}

FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
HELP_FLAG_LINE = re.compile(r"^  (?:-\w, )?(--[a-z0-9][a-z0-9-]*)")
NUM = r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?"
NUM_RE = re.compile(NUM)
UNIT = r"(?:tokens/s|KiB/token|B/token|bytes/token|KiB|MiB|GiB|%|x(?!\w))"
MEASURED = re.compile(rf"((?:{NUM}\s*{UNIT}?\s*-\s*)?{NUM})\s*{UNIT}")


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def run_help(adjsh, args):
    r = subprocess.run([adjsh] + args + ["--help"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"adjsh {' '.join(args)} --help: exit {r.returncode}: {r.stderr}")
    return r.stdout


def help_flags(text):
    """{flag: default or None} of a --help's flag list."""
    flags = {}
    for line in text.splitlines():
        m = HELP_FLAG_LINE.match(line)
        if m and m.group(1) != "--help":
            d = re.search(r"\[default: (.*?)\]\s*$", line)
            flags[m.group(1)] = d.group(1) if d else None
    return flags


def commands(adjsh):
    text = run_help(adjsh, [])
    body = text.split("commands:", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in body.splitlines() if line.strip()]


def all_help(adjsh):
    out = {}
    for c in commands(adjsh):
        if c == "tokenizer":
            flags = {}
            for sub in ("encode", "decode"):
                flags.update(help_flags(run_help(adjsh, ["tokenizer", sub])))
        else:
            flags = help_flags(run_help(adjsh, [c]))
        out[c] = flags
    return out


def strip_fences(text):
    """The lines outside ``` blocks (code blocks' lines become empty, keeping line numbers)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return out


def sections(text):
    """[(heading, [lines])] of the level-2 sections (code blocks' headings are not headings)."""
    result, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            result.append((line[3:].strip(), []))
        elif result:
            result[-1][1].append(line)
    return result


def covered(heading, known):
    names = []
    for span in re.findall(r"`([^`]+)`", heading):
        span = span.strip()
        if span.startswith("adjsh "):
            span = span[len("adjsh "):]
        if span in known:
            names.append(span)
    return names


def cells(line):
    """A table row's cells; `\\|` inside a cell (as in `--dtype f32\\|f64`) does not split it."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def check_usage(res, helps, usage):
    secs = [(h, covered(h, helps), lines) for h, lines in sections(usage)]
    for cmd in helps:
        res.record(f"USAGE.md has a section for adjsh {cmd}", any(cmd in c for _, c, _ in secs),
                   [h for h, _, _ in secs])
    documented = {cmd: {} for cmd in helps}  # cmd -> {flag: default cell}
    for heading, cmds, lines in secs:
        if not cmds:
            continue
        bad_rows, bad_text = [], []
        for line in lines:
            if line.lstrip().startswith("|"):
                row = cells(line)
                row_flags = FLAG.findall(row[0])
                for flag in row_flags:
                    missing = [c for c in cmds if flag not in helps[c]]
                    if missing:
                        bad_rows.append(f"{flag} (not in --help of {', '.join(missing)})")
                    for c in cmds:
                        documented[c][flag] = row[1] if len(row) > 1 else ""
                rest = " ".join(row[1:])
            else:
                rest = line
            for flag in FLAG.findall(rest):
                if flag != "--help" and not any(flag in helps[c] for c in cmds):
                    bad_text.append(flag)
        res.record(f"USAGE.md '{heading}': every flag in its tables is printed by adjsh "
                   f"{'/'.join(cmds)} --help", not bad_rows, bad_rows)
        res.record(f"USAGE.md '{heading}': every other --flag written there is one of adjsh "
                   f"{'/'.join(cmds)}'s", not bad_text, sorted(set(bad_text)))
    for cmd, flags in helps.items():
        missing = sorted(f for f in flags if f not in documented[cmd])
        res.record(f"USAGE.md documents every flag of adjsh {cmd} --help ({len(flags)})",
                   not missing, missing)
        wrong = []
        for flag, default in flags.items():
            if default is not None and flag in documented[cmd]:
                cell = documented[cmd][flag].replace("`", "")
                if default not in cell:
                    wrong.append(f"{flag}: --help says [default: {default}], USAGE.md '{cell}'")
        res.record(f"USAGE.md's defaults of adjsh {cmd} are those --help prints", not wrong,
                   wrong)


def check_flags_exist(res, helps, texts):
    known = set().union(*helps.values()) | {"--help", "--version"}
    for rel, text in texts.items():
        bad = []
        for flag in sorted(set(FLAG.findall(text))):
            if flag in known:
                continue
            where = OTHER_TOOL_FLAGS.get(flag)
            if where is None:
                bad.append(f"{flag} (no adjsh --help prints it)")
            elif where.startswith(("scripts/", "tests/")) and flag not in read(where):
                bad.append(f"{flag} (not in {where})")
        res.record(f"{rel}: every --flag is adjsh's or a named tool's", not bad, bad)


def strip_links_and_code(line):
    line = re.sub(r"\]\([^)]*\)", "]", line)
    return re.sub(r"`[^`]*`", "", line)


def unit_evidence(bench):
    """{(number, unit)} that BENCHMARKS states: written together, or a number in a table
    column whose header names the unit."""
    units = ["tokens/s", "KiB/token", "B/token", "bytes/token", "KiB", "MiB", "GiB", "%"]
    found = set()
    for m in re.finditer(rf"({NUM})\s*{UNIT}", bench):
        found.add((m.group(1), re.sub(r"^\s+", "", bench[m.end(1):m.end()])))
    header = None
    for line in bench.splitlines():
        if not line.strip().startswith("|"):
            header = None
            continue
        row = cells(line)
        if all(re.fullmatch(r":?-+:?", c) for c in row if c):
            continue  # the separator
        if header is None:
            header = row
            continue
        for head, cell in zip(header, row):
            for unit in units:
                if unit in head:
                    for n in NUM_RE.findall(cell):
                        found.add((n, unit))
    return found


def check_figures(res, texts, bench):
    known = set(NUM_RE.findall(bench))
    stated = unit_evidence(bench)
    readme = texts["README.md"]
    m = re.search(r"<!-- figures:begin -->(.*?)<!-- figures:end -->", readme, re.S)
    rows = []
    if m:
        rows = [line for line in m.group(1).splitlines()
                if line.strip().startswith("|") and not re.match(r"^\|[\s|:-]+\|$", line.strip())]
        rows = rows[1:]  # the header
    res.record(f"README.md has a headline table of figures ({len(rows)} rows)", len(rows) >= 8,
               "no table between <!-- figures:begin --> and <!-- figures:end -->" if not m
               else rows)
    bad = []
    for row in rows:
        for n in NUM_RE.findall(strip_links_and_code(row)):
            if n not in known:
                bad.append(f"{n} in: {row[:120]}")
    res.record("every number of README.md's headline table is in docs/BENCHMARKS.md", not bad,
               bad)
    for rel, text in texts.items():
        bad, count = [], 0
        for lineno, line in enumerate(strip_fences(text), 1):
            for mm in MEASURED.finditer(strip_links_and_code(line)):
                unit = mm.group(0)[len(mm.group(1)):].strip()
                for n in NUM_RE.findall(mm.group(1)):
                    count += 1
                    if (n, unit) not in stated:
                        bad.append(f"{rel}:{lineno}: {n} {unit} ('{mm.group(0).strip()}')")
        res.record(f"{rel}: the {count} measured figures with units are in docs/BENCHMARKS.md "
                   "with those units", not bad, bad)


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            seen.setdefault("\0fence", 0)
            seen["\0fence"] ^= 1
            continue
        if seen.get("\0fence"):
            continue
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    return out


def check_links(res, texts):
    for rel, text in texts.items():
        bad = []
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(rel), path)) if path \
                else os.path.join(ROOT, rel)
            if not os.path.exists(full):
                bad.append(f"{target} (no such file)")
            elif anchor and full.endswith(".md"):
                with open(full, encoding="utf-8") as f:
                    if anchor not in anchors(f.read()):
                        bad.append(f"{target} (no such heading)")
        res.record(f"{rel}: every relative link resolves", not bad, bad)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    res = Results()
    adjsh = os.path.abspath(a.adjsh)
    texts = {}
    for rel in DOCS:
        ok = os.path.exists(os.path.join(ROOT, rel))
        res.record(f"{rel} exists", ok)
        if ok:
            texts[rel] = read(rel)
    helps = all_help(adjsh)
    res.record(f"adjsh --help lists commands ({len(helps)})", len(helps) >= 10, helps)
    if "docs/USAGE.md" in texts:
        check_usage(res, helps, texts["docs/USAGE.md"])
    check_flags_exist(res, helps, texts)
    if "README.md" in texts:
        check_figures(res, texts, read("docs/BENCHMARKS.md"))
    check_links(res, texts)
    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
