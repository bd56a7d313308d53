#!/usr/bin/env python3
"""Checks that cocemu's documentation cannot drift from the code (ctest label `docs`).

For each Markdown file given (README.md, docs/*.md) it checks:

  * runnable blocks: every ```console block is run line by line in a temporary folder, in the
    order of the file (so a later command can read what an earlier one wrote). A line starting
    with "$ " is a command (a trailing backslash continues it); the lines after it, up to the
    next command, are output that the command must print: each one, with runs of spaces
    collapsed, must occur inside one line of the real output ("..." inside a shown line skips
    any text; a line that is only "..." is just an elision; a figure written "~1.68e-09" varies
    from machine to machine — an f32 result that depends on the BLAS kernel, a time — and matches
    any number printed there). A command must exit 0, unless the
    block is marked <!-- run: exit N -->. <!-- norun: why --> before a block skips running it
    (its options are still checked);
  * includes: a code block after <!-- include: PATH --> (or PATH#ANCHOR, the lines between
    "ANCHOR: name" and "ANCHOR_END: name" comments of that file) must equal that file's text,
    so the examples shown are the files the build compiles and ctest runs. A ```cpp block
    without an include marker is an error (C++ shown must be compiled somewhere);
  * options: every --option of a `cocemu SUB ...` command (in code blocks and inline code)
    must exist in `cocemu SUB --help`; on a subcommand's own page (docs/SUB.md) every --option
    in inline code must exist in SUB's help, unless listed in <!-- foreign-options: ... -->
    (flags of other tools, e.g. Megatron's);
  * generated text: the text between <!-- generated: COMMAND --> and <!-- end generated --> must
    equal COMMAND's output (skipped, with a message, while COMMAND's option does not exist);
    <!-- generated-file: DEST from OUTPUT after: COMMAND --> requires the committed file DEST to
    equal OUTPUT as COMMAND writes it. --update rewrites both;
  * TODO markers: <!-- TODO(lead) when SUB --option: ... --> or <!-- TODO(lead) when file
    PATH: ... --> fail once that option or file exists (the feature has landed);
  * local links: every relative link target exists;
  * no history: no dates (YYYY-MM-DD), no commit hashes (hex words of 7-40 characters with
    digits and letters, outside URLs), none of HISTORY_PHRASES. CHANGELOG.md is the place for
    those.

With --index it also checks the set of documents: README.md at most README_MAX_LINES lines, a
page docs/SUB.md and a row in README's table for every subcommand `cocemu --help` lists, and every
page of docs/ linked from README.md. --selftest runs the checker on small broken documents and
requires each to fail with the expected message.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

README_MAX_LINES = 250
COMMAND_TIMEOUT_S = 300

# Phrases that tell a story of change rather than say what is (regular expressions, case-blind).
HISTORY_PHRASES = [
    r"before/after",
    r"\bwas\b[^.:;\n]{0,60}\bnow\b",
    r"\bnot kept\b",
    r"\bno longer\b",
    r"\bused to\b",
    r"\bpreviously\b",
    r"\bformerly\b",
    r"(?:^|[.!?]\s+)until\b",
    r"\buntil (?:now|recently|today|this (?:change|commit))\b",
    r"\bre-?measured\b",
    r"\bthis (?:session|morning|afternoon|evening|night)\b",
    r"\bsession \d",
    r"\b(?:yesterday|last (?:week|night))\b",
    r"\bwe (?:tried|changed|considered)\b",
    r"\bthe commit (?:before|after)\b",
]
DATE_RE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
HEX_RE = re.compile(r"\b[0-9a-fA-F]{7,40}\b")
URL_RE = re.compile(r"https?://[^\s)>\]]+")
FENCE_RE = re.compile(r"^(\s*)(`{3,})([\w+-]*)\s*$")
COMMENT_RE = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")
INLINE_CODE_RE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
OPTION_RE = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9-]*")
# A figure in shown output that varies by machine: "~" before a number ("~1.68e-09", "~0.0337").
# It matches any number there (an optional "~" and sign, digits, a fraction, an exponent).
VARYING_RE = re.compile(r"~([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)")
NUMBER_PATTERN = r"~?[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"


@dataclass
class Block:
    lang: str
    start: int  # 1-based line of the opening fence
    lines: list[str]
    markers: list[str]


@dataclass
class Doc:
    path: Path
    rel: str
    text: str
    lines: list[str]
    blocks: list[Block] = field(default_factory=list)
    comments: list[tuple[int, str]] = field(default_factory=list)  # (line, comment text)


class Checker:
    def __init__(self, src: Path, cocemu: str, build: Path | None, run: bool):
        self.src = src
        self.cocemu = cocemu
        self.build = build
        self.run_commands = run
        self.errors: list[str] = []
        self.notes: list[str] = []
        self._help: dict[str, set[str] | None] = {}
        self._subcommands: list[str] | None = None

    # ----- the CLI's own description of itself
    def subcommands(self) -> list[str]:
        if self._subcommands is None:
            out = self._run_plain([self.cocemu, "--help"])
            subs, in_subs = [], False
            for line in out.splitlines():
                if line.startswith("Subcommands:"):
                    in_subs = True
                    continue
                if in_subs:
                    m = re.match(r"^\s{2}(\w+)\s", line)
                    if m:
                        subs.append(m.group(1))
                    elif line.strip() and not line.startswith(" "):
                        in_subs = False
            self._subcommands = subs
        return self._subcommands

    def options_of(self, sub: str) -> set[str] | None:
        if sub not in self._help:
            if sub not in self.subcommands():
                self._help[sub] = None
            else:
                out = self._run_plain([self.cocemu, sub, "--help"])
                opts: set[str] = set()
                for line in out.splitlines():
                    if re.match(r"^\s+-", line):
                        opts.update(re.findall(r"(?:^|[\s,])(--[A-Za-z0-9][A-Za-z0-9-]*)", line))
                self._help[sub] = opts
        return self._help[sub]

    def _run_plain(self, argv: list[str]) -> str:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=COMMAND_TIMEOUT_S)
        return p.stdout + p.stderr

    def error(self, doc: Doc, line: int, message: str) -> None:
        self.errors.append(f"{doc.rel}:{line}: {message}")

    # ----- parsing
    def parse(self, path: Path) -> Doc:
        text = path.read_text(encoding="utf-8")
        try:
            rel = str(path.resolve().relative_to(self.src.resolve()))
        except ValueError:
            rel = str(path)
        doc = Doc(path, rel, text, text.split("\n"))
        pending: list[str] = []
        i = 0
        while i < len(doc.lines):
            line = doc.lines[i]
            c = COMMENT_RE.match(line)
            if c:
                doc.comments.append((i + 1, c.group(1)))
                pending.append(c.group(1))
                i += 1
                continue
            f = FENCE_RE.match(line)
            if f:
                indent, fence, lang, start = f.group(1), f.group(2), f.group(3), i
                body = []
                i += 1
                while i < len(doc.lines) and not re.match(r"^\s*" + fence + r"\s*$", doc.lines[i]):
                    # A block inside a list item is indented like its fence.
                    line = doc.lines[i]
                    body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
                    i += 1
                if i >= len(doc.lines):
                    self.error(doc, start + 1, "code block is never closed")
                doc.blocks.append(Block(lang, start + 1, body, pending))
                pending = []
                i += 1
                continue
            if line.strip():
                pending = []
            i += 1
        return doc

    # ----- the checks
    def check_doc(self, doc: Doc, workdir: Path | None, update: bool) -> None:
        self.check_history(doc)
        self.check_links(doc)
        self.check_todos(doc)
        self.check_includes(doc, update)
        self.check_options(doc)
        self.check_generated(doc, update)
        if self.run_commands and workdir is not None:
            self.run_blocks(doc, workdir)

    def check_history(self, doc: Doc) -> None:
        # Every line, generated blocks included: text a command writes into a page (a reference's
        # source, say) is held to the same rules as text typed there.
        lines = list(enumerate(doc.lines, 1))
        for n, line in lines:
            no_urls = URL_RE.sub(" ", line)
            for m in DATE_RE.finditer(no_urls):
                self.error(doc, n, f"date '{m.group(0)}': dates belong in CHANGELOG.md")
            for m in HEX_RE.finditer(no_urls):
                word = m.group(0)
                if re.fullmatch(r"\d+[eE]\d+", word):  # a number in scientific notation
                    continue
                if re.search(r"\d", word) and re.search(r"[A-Fa-f]", word):
                    self.error(doc, n, f"'{word}' looks like a commit hash: history belongs in CHANGELOG.md")
        # Phrases may wrap over lines: search paragraph by paragraph, report the first line.
        para: list[tuple[int, str]] = []

        def flush():
            if not para:
                return
            joined = " ".join(t for _, t in para)
            reported: set[int] = set()
            for pattern in HISTORY_PHRASES:
                m = re.search(pattern, joined, re.IGNORECASE)
                if m:
                    offset, line_no = m.start(), para[0][0]
                    for n, t in para:
                        if offset <= len(t):
                            line_no = n
                            break
                        offset -= len(t) + 1
                    if line_no in reported:
                        continue
                    reported.add(line_no)
                    self.error(doc, line_no, f"'{m.group(0).strip()}' tells history (write what is; "
                               "what changed goes in CHANGELOG.md)")
            para.clear()

        for n, line in lines:
            if line.strip():
                para.append((n, line))
            else:
                flush()
        flush()

    @staticmethod
    def anchors(path: Path) -> set[str]:
        """GitHub's anchors of a Markdown file's headings."""
        found: set[str] = set()
        in_code = False
        for line in path.read_text(encoding="utf-8").split("\n"):
            if FENCE_RE.match(line):
                in_code = not in_code
                continue
            m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
                base, k = slug, 1
                while slug in found:
                    slug, k = f"{base}-{k}", k + 1
                found.add(slug)
        return found

    def check_links(self, doc: Doc) -> None:
        for n, line in enumerate(doc.lines, 1):
            for m in LINK_RE.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target):
                    continue
                local, _, anchor = target.partition("#")
                dest = (doc.path.parent / local) if local else doc.path
                if not dest.exists():
                    self.error(doc, n, f"link to '{target}', which does not exist")
                elif anchor and dest.suffix == ".md" and anchor not in self.anchors(dest):
                    self.error(doc, n, f"link to '{target}': {dest.name} has no heading with that anchor")
        for m in re.finditer(r'<img [^>]*src="([^"]+)"', doc.text):
            if not re.match(r"^[a-z]+:", m.group(1)) and not (doc.path.parent / m.group(1)).exists():
                self.error(doc, doc.text[: m.start()].count("\n") + 1, f"image '{m.group(1)}' does not exist")

    def check_todos(self, doc: Doc) -> None:
        for n, c in doc.comments:
            m = re.match(r"TODO\(lead\)(?: when (.+?))?:", c)
            if not m:
                continue
            cond = m.group(1)
            if cond is None:
                self.error(doc, n, "TODO(lead) without a 'when' condition: say when it is due "
                           "('when SUB --option' or 'when file PATH')")
                continue
            fm = re.fullmatch(r"file (\S+)", cond)
            om = re.fullmatch(r"(\w+) (--[\w-]+)", cond)
            if fm:
                if (self.src / fm.group(1)).exists():
                    self.error(doc, n, f"{fm.group(1)} exists now: resolve this TODO ({c})")
            elif om:
                opts = self.options_of(om.group(1))
                if opts is not None and om.group(2) in opts:
                    self.error(doc, n, f"`cocemu {om.group(1)} {om.group(2)}` exists now: resolve this TODO ({c})")
            else:
                self.error(doc, n, f"TODO(lead) condition '{cond}' is neither 'SUB --option' nor 'file PATH'")

    def include_text(self, doc: Doc, n: int, spec: str) -> str | None:
        path, _, anchor = spec.partition("#")
        f = self.src / path
        if not f.is_file():
            self.error(doc, n, f"include: {path} does not exist")
            return None
        text = f.read_text(encoding="utf-8")
        if not anchor:
            return text.rstrip("\n")
        lines = text.split("\n")
        start = [i for i, l in enumerate(lines) if re.search(r"\bANCHOR: " + re.escape(anchor) + r"\s*$", l)]
        end = [i for i, l in enumerate(lines) if re.search(r"\bANCHOR_END: " + re.escape(anchor) + r"\s*$", l)]
        if len(start) != 1 or len(end) != 1 or end[0] <= start[0]:
            self.error(doc, n, f"include: {path} has no single 'ANCHOR: {anchor}' ... 'ANCHOR_END: {anchor}' pair")
            return None
        return "\n".join(lines[start[0] + 1 : end[0]])

    def check_includes(self, doc: Doc, update: bool = False) -> None:
        new_lines, changed = list(doc.lines), False
        for b in reversed(doc.blocks):
            inc = [m[len("include:"):].strip() for m in b.markers if m.startswith("include:")]
            if not inc or not update:
                continue
            want = self.include_text(doc, b.start, inc[0])
            if want is not None and "\n".join(b.lines) != want:
                indent = re.match(r"^(\s*)", doc.lines[b.start - 1]).group(1)
                new_lines[b.start : b.start + len(b.lines)] = [indent + l if l else l for l in want.split("\n")]
                changed = True
                self.notes.append(f"{doc.rel}: regenerated the block included from {inc[0]}")
        if changed:
            doc.path.write_text("\n".join(new_lines), encoding="utf-8")
            fresh = self.parse(doc.path)
            doc.text, doc.lines, doc.blocks, doc.comments = fresh.text, fresh.lines, fresh.blocks, fresh.comments
        for b in doc.blocks:
            inc = [m[len("include:"):].strip() for m in b.markers if m.startswith("include:")]
            if not inc:
                if b.lang in ("cpp", "c++", "python", "py"):
                    self.error(doc, b.start, f"a ```{b.lang} block without <!-- include: FILE --> "
                               "(code shown must be a file the tests compile and run)")
                continue
            want = self.include_text(doc, b.start, inc[0])
            if want is not None and "\n".join(b.lines) != want:
                self.error(doc, b.start, f"block differs from {inc[0]} (copy the file's text into the block)")

    def commands_in(self, text: str) -> list[tuple[str, list[str]]]:
        """(subcommand, options) of every `cocemu SUB ...` in a command line."""
        try:
            lex = shlex.shlex(text, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            lex.commenters = "#"
            tokens = list(lex)
        except ValueError:
            tokens = text.split()
        found = []
        i = 0
        while i < len(tokens):
            t = tokens[i]
            if (t == "cocemu" or t.endswith("/cocemu")) and i + 1 < len(tokens):
                sub, opts = tokens[i + 1], []
                j = i + 2
                while j < len(tokens) and not re.fullmatch(r"[|;&<>()]+", tokens[j]):
                    if OPTION_RE.match(tokens[j]):
                        opts.append(OPTION_RE.match(tokens[j]).group(0))
                    j += 1
                # Not output such as "cocemu train: ...", nor a placeholder such as `cocemu SUB`.
                if re.fullmatch(r"\w+", sub) and not sub.isupper():
                    found.append((sub, opts))
                i = j
            else:
                i += 1
        return found

    def check_command_options(self, doc: Doc, n: int, text: str) -> None:
        for sub, opts in self.commands_in(text):
            known = self.options_of(sub)
            if known is None:
                self.error(doc, n, f"`cocemu {sub}`: no such subcommand (cocemu --help lists "
                           f"{', '.join(self.subcommands())})")
                continue
            for o in opts:
                if o not in known:
                    self.error(doc, n, f"`cocemu {sub} {o}`: {sub} has no option {o} (see cocemu {sub} --help)")

    def check_options(self, doc: Doc) -> None:
        page_sub = doc.path.stem if doc.path.parent.name == "docs" else None
        if page_sub not in self.subcommands():
            page_sub = None
        foreign: set[str] = set()
        for _, c in doc.comments:
            if c.startswith("foreign-options:"):
                foreign.update(c[len("foreign-options:"):].split())
        in_block = set()
        for b in doc.blocks:
            for k in range(len(b.lines)):
                in_block.add(b.start + 1 + k)
            if b.lang in ("console", "bash", "sh", "shell"):
                for n, cmd in self.block_commands(b):
                    self.check_command_options(doc, n, cmd)
        for n, line in enumerate(doc.lines, 1):
            if n in in_block or COMMENT_RE.match(line):
                continue
            for m in INLINE_CODE_RE.finditer(line):
                code = m.group(1)
                if re.search(r"(?:^|[\s/])cocemu\s+\w", code):
                    self.check_command_options(doc, n, code)
                    continue
                first = code.split()[0] if code.split() else ""
                if first in self.subcommands() and len(code.split()) > 1 and code.split()[1].startswith("--"):
                    self.check_command_options(doc, n, "cocemu " + code)
                    continue
                if page_sub is None:
                    continue
                known = self.options_of(page_sub) or set()
                for tok in code.replace(",", " ").split():
                    om = OPTION_RE.match(tok)
                    if om and om.group(0) not in known and om.group(0) not in foreign:
                        self.error(doc, n, f"`{om.group(0)}` is not an option of `cocemu {page_sub}` "
                                   "(list other tools' flags in <!-- foreign-options: ... -->)")

    @staticmethod
    def block_commands(b: Block) -> list[tuple[int, str]]:
        """(line, command) of a block: '$ ' lines in console blocks, every line otherwise."""
        out, cur, cur_n = [], None, 0
        for k, line in enumerate(b.lines):
            n = b.start + 1 + k
            if cur is not None:
                cur += "\n" + line
                if not line.rstrip().endswith("\\"):
                    out.append((cur_n, cur.replace("\\\n", " ")))
                    cur = None
                continue
            if b.lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if line.rstrip().endswith("\\"):
                cur, cur_n = line, n
            elif line.strip():
                out.append((n, line))
        if cur is not None:
            out.append((cur_n, cur.replace("\\\n", " ")))
        return out

    def check_generated(self, doc: Doc, update: bool) -> None:
        new_lines, changed = list(doc.lines), False
        i = 0
        while i < len(doc.lines):
            c = COMMENT_RE.match(doc.lines[i])
            if c and c.group(1).startswith("generated-file:"):
                self.check_generated_file(doc, i + 1, c.group(1), update)
            if c and c.group(1).startswith("generated:"):
                cmd = c.group(1)[len("generated:"):].strip()
                end = next((j for j in range(i + 1, len(doc.lines))
                            if COMMENT_RE.match(doc.lines[j]) and COMMENT_RE.match(doc.lines[j]).group(1) == "end generated"), None)
                if end is None:
                    self.error(doc, i + 1, "<!-- generated: ... --> without <!-- end generated -->")
                    return
                subs = self.commands_in(cmd)
                missing = [(s, o) for s, opts in subs for o in opts if o not in (self.options_of(s) or set())]
                if missing:
                    self.notes.append(f"{doc.rel}:{i + 1}: SKIPPED the generated block: `cocemu {missing[0][0]} "
                                      f"{missing[0][1]}` does not exist yet")
                else:
                    out = self.run_in_tmp(cmd)
                    if out is None:
                        self.error(doc, i + 1, f"`{cmd}` failed")
                    else:
                        want = out.rstrip("\n").split("\n")
                        have = doc.lines[i + 1 : end]
                        if have != want:
                            if update:
                                new_lines[i + 1 : end] = want
                                changed = True
                                self.notes.append(f"{doc.rel}: regenerated the block of `{cmd}`")
                            else:
                                self.error(doc, i + 1, f"the block generated by `{cmd}` differs from its output "
                                           "(run tests/docs/check_docs.py --update)")
                i = end
            i += 1
        if changed:
            doc.path.write_text("\n".join(new_lines), encoding="utf-8")

    def check_generated_file(self, doc: Doc, n: int, comment: str, update: bool) -> None:
        m = re.fullmatch(r"generated-file:\s*(\S+)\s+from\s+(\S+)\s+after:\s*(.+)", comment)
        if not m:
            self.error(doc, n, "generated-file marker must read 'generated-file: DEST from OUTPUT after: COMMAND'")
            return
        dest, output, cmd = m.groups()
        with tempfile.TemporaryDirectory(prefix="cocemu-docs-") as tmp:
            status, out = self.run_shell(cmd, Path(tmp))
            if status != 0:
                tail = "\n".join(out.rstrip().split("\n")[-5:])
                self.error(doc, n, f"`{cmd}` exited {status}:\n{tail}")
                return
            produced = Path(tmp) / output
            if not produced.is_file():
                self.error(doc, n, f"`{cmd}` wrote no {output}")
                return
            target = self.src / dest
            if not target.is_file() or target.read_bytes() != produced.read_bytes():
                if update:
                    shutil.copyfile(produced, target)
                    self.notes.append(f"{doc.rel}: regenerated {dest}")
                else:
                    self.error(doc, n, f"{dest} differs from what `{cmd}` writes to {output} "
                               "(run tests/docs/check_docs.py --update)")

    # ----- running
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = str(Path(self.cocemu).resolve().parent) + os.pathsep + env.get("PATH", "")
        env["OPENBLAS_NUM_THREADS"] = "1"
        env["COCEMU"] = str(self.tree)
        return env

    def make_tree(self, root: Path) -> None:
        """$COCEMU as the docs use it: the source tree with its build in build/."""
        self.tree = root / "cocemu"
        self.tree.mkdir()
        for entry in self.src.iterdir():
            if entry.name not in ("build", ".git"):
                (self.tree / entry.name).symlink_to(entry.resolve())
        if self.build is not None:
            (self.tree / "build").symlink_to(self.build.resolve())

    def run_shell(self, cmd: str, cwd: Path) -> tuple[int, str]:
        try:
            p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=self.env(),
                               capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
            return p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            return -1, f"(timed out after {COMMAND_TIMEOUT_S} s)"

    def run_in_tmp(self, cmd: str) -> str | None:
        with tempfile.TemporaryDirectory(prefix="cocemu-docs-") as tmp:
            status, out = self.run_shell(cmd, Path(tmp))
            return out if status == 0 else None

    @staticmethod
    def norm(s: str) -> str:
        return " ".join(s.split())

    @staticmethod
    def shown_pattern(expected: str) -> re.Pattern[str]:
        """A shown output line as a pattern: its text literally (runs of spaces collapsed), "..."
        any text, "~FIGURE" any number (a figure that varies by machine)."""
        out = []
        for k, part in enumerate(Checker.norm(expected).split("...")):
            if k:
                out.append(".*?")
            pieces = VARYING_RE.split(Checker.norm(part))
            for j, piece in enumerate(pieces):
                out.append(NUMBER_PATTERN if j % 2 else re.escape(piece))
        return re.compile("".join(out))

    def output_matches(self, expected: str, actual_lines: list[str]) -> bool:
        pattern = self.shown_pattern(expected)
        return any(pattern.search(line) for line in actual_lines)

    def run_blocks(self, doc: Doc, workdir: Path) -> None:
        for b in doc.blocks:
            if b.lang != "console":
                continue
            if any(m.startswith("norun") for m in b.markers):
                continue
            expect = 0
            for m in b.markers:
                em = re.fullmatch(r"run:\s*exit\s+(\d+)", m)
                if em:
                    expect = int(em.group(1))
            steps: list[tuple[int, str, list[str]]] = []
            for k, line in enumerate(b.lines):
                n = b.start + 1 + k
                if line.startswith("$ "):
                    steps.append((n, line[2:], []))
                elif steps and steps[-1][1].rstrip().endswith("\\") and not steps[-1][2]:
                    steps[-1] = (steps[-1][0], steps[-1][1] + "\n" + line, [])
                elif steps:
                    steps[-1][2].append(line)
                elif line.strip():
                    self.error(doc, n, "a console block must start with a '$ ' command")
            for n, cmd, shown in steps:
                t0 = time.monotonic()
                status, out = self.run_shell(cmd.replace("\\\n", " "), workdir)
                took = time.monotonic() - t0
                self.notes.append(f"{doc.rel}:{n}: {took:6.2f} s  $ {' '.join(cmd.split())[:100]}")
                if status != expect:
                    tail = "\n".join(out.rstrip().split("\n")[-15:])
                    self.error(doc, n, f"`{' '.join(cmd.split())}` exited {status}, expected {expect}:\n{tail}")
                    continue
                actual = [self.norm(l) for l in out.split("\n")]
                for k, want in enumerate(shown):
                    if not want.strip() or want.strip() in ("...", "…"):
                        continue
                    if not self.output_matches(want, actual):
                        self.error(doc, n + 1 + k, f"output line not printed by `{' '.join(cmd.split())[:80]}`:\n"
                                   f"    shown:  {want.strip()}\n    actual output:\n" +
                                   "\n".join("      " + l for l in out.rstrip().split("\n")[:60]))

    # ----- the set of documents
    def check_index(self, readme: Doc) -> None:
        n_lines = readme.text.rstrip("\n").count("\n") + 1
        if n_lines > README_MAX_LINES:
            self.error(readme, n_lines, f"README.md has {n_lines} lines; at most {README_MAX_LINES} "
                       "(move detail to docs/)")
        docs_dir = self.src / "docs"
        for sub in self.subcommands():
            if not (docs_dir / f"{sub}.md").is_file():
                self.error(readme, 1, f"subcommand `{sub}` has no page docs/{sub}.md")
            if not re.search(r"^\|\s*\[?`" + re.escape(sub) + r"`", readme.text, re.M):
                self.error(readme, 1, f"subcommand `{sub}` has no row in README.md's table of subcommands")
        linked = {str((readme.path.parent / m).resolve()) for m in re.findall(r"\]\(([^)#\s]+)", readme.text)}
        for page in sorted(docs_dir.glob("*.md")):
            if str(page.resolve()) not in linked:
                self.error(readme, 1, f"docs/{page.name} is not linked from README.md")


def check(src: Path, cocemu: str, build: Path | None, files: list[Path], index: bool, run: bool,
          update: bool) -> Checker:
    ch = Checker(src, cocemu, build, run)
    with tempfile.TemporaryDirectory(prefix="cocemu-docs-") as tmp:
        ch.make_tree(Path(tmp))
        for f in files:
            doc = ch.parse(f)
            work = Path(tmp) / ("work-" + re.sub(r"\W", "_", doc.rel))
            work.mkdir()
            ch.check_doc(doc, work, update)
            if index and f.name == "README.md":
                ch.check_index(doc)
    return ch


SELFTEST_CASES = [
    # (name, document text, a fragment the failure must contain; None: must pass)
    ("clean", "# Page\n\nRun `cocemu bench --dry-run`.\n\n```console\n$ cocemu --help\n"
     "Subcommands:\n```\n", None),
    ("removed option", "Run `cocemu bench --no-such-option`.\n", "bench has no option --no-such-option"),
    ("option in a block", "```bash\ncocemu tune --model x --frobnicate\n```\n", "tune has no option --frobnicate"),
    ("broken command", "```console\n$ cocemu bench --repeats 0\n```\n", "exited 2, expected 0"),
    ("output drift", "```console\n$ cocemu --help\nSubcommands: frobnicate\n```\n", "output line not printed"),
    ("varying figure", "```console\n$ echo 'relative error 1.12e-09 (bound 0.000103)'\n"
     "relative error ~1.68e-09 (bound 0.000103)\n```\n", None),
    ("varying figure, fixed text", "```console\n$ echo 'relative error 1.12e-09 (bound 0.5)'\n"
     "relative error ~1.68e-09 (bound 0.000103)\n```\n", "output line not printed"),
    ("varying figure is a number", "```console\n$ echo 'relative error nan (bound 0.000103)'\n"
     "relative error ~1.68e-09 (bound 0.000103)\n```\n", "output line not printed"),
    ("date", "Measured on 2026-11-24.\n", "date '2026-11-24'"),
    ("hash", "Since c3a4aca the table is faster.\n", "looks like a commit hash"),
    ("history phrase", "The plan was slow and is now\nfast.\n", "tells history"),
    ("not kept", "Huge pages were tried and not kept.\n", "tells history"),
    ("cpp without include", "```cpp\nint main() {}\n```\n", "without <!-- include"),
    ("include drift", "<!-- include: tests/docs/check_docs.py#nothing -->\n```python\nx\n```\n", "no single 'ANCHOR"),
    ("include drift 2", "<!-- include: .clang-format -->\n```yaml\nBasedOnStyle: none\n```\n", "block differs"),
    ("scientific notation", "The peak is 1.9789e15 FLOP/s.\n", None),
    ("dead link", "See [this](no/such/file.md).\n", "does not exist"),
    ("dead anchor", "# Top\n\nSee [below](#no-such-heading) and [top](#top).\n", "no heading with that anchor"),
    ("due TODO", "<!-- TODO(lead) when bench --dry-run: describe it -->\n", "exists now: resolve this TODO"),
    ("unknown subcommand", "Run `cocemu frobnicate --x`.\n", "no such subcommand"),
]


def selftest(src: Path, cocemu: str) -> int:
    failures = 0
    with tempfile.TemporaryDirectory(prefix="cocemu-docs-selftest-") as tmp:
        for name, text, fragment in SELFTEST_CASES:
            f = Path(tmp) / (re.sub(r"\W", "_", name) + ".md")
            f.write_text(text, encoding="utf-8")
            ch = check(src, cocemu, None, [f], index=False, run=True, update=False)
            report = "\n".join(ch.errors)
            if fragment is None and ch.errors:
                print(f"selftest '{name}': expected no error, got:\n{report}")
                failures += 1
            elif fragment is not None and fragment not in report:
                print(f"selftest '{name}': expected an error containing '{fragment}', got:\n{report or '(none)'}")
                failures += 1
            else:
                print(f"selftest '{name}': ok")
    print(f"selftest: {len(SELFTEST_CASES) - failures} of {len(SELFTEST_CASES)} cases behave")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[2], help="source tree")
    ap.add_argument("--cocemu", default=None, help="the cocemu binary (default: SRC/build/cli/cocemu)")
    ap.add_argument("--build", type=Path, default=None, help="the build folder $COCEMU/build stands for")
    ap.add_argument("--index", action="store_true", help="also check README's size and the set of pages")
    ap.add_argument("--no-run", action="store_true", help="do not run the console blocks")
    ap.add_argument("--update", action="store_true", help="rewrite generated blocks and files")
    ap.add_argument("--selftest", action="store_true", help="check that the checker catches drift")
    ap.add_argument("--timings", action="store_true", help="print each command's run time")
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md docs/*.md)")
    a = ap.parse_args()
    src = a.src.resolve()
    build = a.build or src / "build"
    cocemu = a.cocemu or str(build / "cli" / "cocemu")
    if not os.access(cocemu, os.X_OK):
        print(f"check_docs: no cocemu binary at {cocemu} (build it, or pass --cocemu)")
        return 2
    if a.selftest:
        return selftest(src, cocemu)
    files = a.files or [src / "README.md", *sorted((src / "docs").glob("*.md"))]
    ch = check(src, cocemu, build, files, a.index, not a.no_run, a.update)
    for note in ch.notes:
        if a.timings or "SKIPPED" in note or "regenerated" in note:
            print(note)
    for e in ch.errors:
        print("ERROR " + e)
    names = ", ".join(str(f.name) for f in files)
    if ch.errors:
        print(f"check_docs: {len(ch.errors)} error(s) in {names}")
        return 1
    print(f"check_docs: {names}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
