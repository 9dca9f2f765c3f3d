"""The documents follow the code: README.md, docs/, ARCHITECTURE.md, SECURITY.md and BENCHMARKS.md.

- Every relative link names a file that exists, and every #anchor a heading of that file.
- Every `tally`, `tallyd` and `tally-worker` command in a code block (and every command that the
  current-figures table of BENCHMARKS.md names) uses a verb and flags the built binaries take: asked
  of the binaries themselves (`tally VERB --help`, `--helpfull`), not of a list kept here.
- Every repository path a command names (scripts/, bench/, examples/, tests/) exists, and every
  `bench/gpu/run.sh SUITE` names a suite of bench/gpu.
"""
import glob
import os
import re
import shlex
import subprocess
import unittest

import tallytest as tt

DOCS = ([os.path.join(tt.SRC, n) for n in ("README.md", "ARCHITECTURE.md", "SECURITY.md", "BENCHMARKS.md")] +
        sorted(glob.glob(os.path.join(tt.SRC, "docs", "*.md"))))
BINARIES = ("tally", "tallyd", "tally-worker")


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def read(path):
    with open(path) as f:
        return f.read()


def headings(path):
    found, fence = set(), False
    with open(path) as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            elif not fence and re.match(r"#{1,6} ", line):
                found.add(anchor(line.lstrip("#")))
    return found


def code_lines(path):
    """The lines of a document's code blocks and its inline code spans, continuations joined."""
    text = read(path)
    lines = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        lines += block.replace("\\\n", " ").split("\n")
    lines += re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    return lines


def commands(line):
    """(binary, words after it) for each Tally command in a line of code: the binary (or a path
    ending in it) where a command starts: the line's start, after ; && | ( or $(, after env
    assignments or a wrapper (exec, sudo, env, nohup, timeout N, taskset -c L)."""
    line = line.split(" #")[0]
    found = []
    for m in re.finditer(r"(?:^|(?<=[\s;(|&]))(?:[\w.$/{}-]*/)?(tally-worker|tallyd|tally)(?=\s)(.*)", line):
        before = line[:m.start()].split()
        while before and (re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", before[-1]) or
                          before[-1] in ("exec", "sudo", "env", "nohup", "-c") or re.fullmatch(r"[\d.,-]+", before[-1])
                          or before[-1] in ("timeout", "taskset")):
            before.pop()
        if before and not re.search(r"[;&|(]$", before[-1]):
            continue  # An argument (a container's or a deployment's name), not a command.
        try:
            words = shlex.split(m.group(2), posix=True)
        except ValueError:
            words = m.group(2).split()
        found.append((m.group(1), words))
    return found


class DocsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.help = {}

    def flags_of(self, binary, verb=None):
        key = (binary, verb)
        if key not in self.help:
            if binary == "tally":
                args = [os.path.join(tt.BIN, "tally"), verb, "--help"]
            else:
                args = [os.path.join(tt.BIN, binary), "--helpfull"]
            p = subprocess.run(args, capture_output=True, text=True, timeout=60)
            text = p.stdout + p.stderr
            flags = {f.replace("-", "_") for f in re.findall(r"--([a-z][a-z0-9_-]*)", text)}
            self.help[key] = (p.returncode, flags | ({"data_root", "help", "helpfull"} if binary != "tally"
                                                      else {"help"}))
        return self.help[key]

    def test_links_resolve(self):
        bad = []
        for path in DOCS:
            text = re.sub(r"^```.*?^```", "", read(path), flags=re.S | re.M)
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if target.startswith(("http://", "https://", "mailto:")):
                    continue
                file_part, _, frag = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(dest):
                    bad.append(f"{os.path.relpath(path, tt.SRC)}: {target} (no such file)")
                elif frag and dest.endswith(".md") and frag not in headings(dest):
                    bad.append(f"{os.path.relpath(path, tt.SRC)}: {target} (no such heading)")
        self.assertEqual(bad, [])

    def test_commands_use_verbs_and_flags_the_binaries_take(self):
        verbs = re.findall(r"^  ([a-z]+)\s", subprocess.run([os.path.join(tt.BIN, "tally"), "help"],
                                                            capture_output=True, text=True).stdout, re.M)
        self.assertIn("run", verbs)
        checked, bad = 0, []
        for path in DOCS:
            for line in code_lines(path):
                for binary, words in commands(line):
                    verb = None
                    if binary == "tally":
                        if not words or not re.fullmatch(r"[a-z]+", words[0]) or words[0] == "help":
                            continue  # `tally --version`, `tally VERB --help`, a picture's label
                        verb = words[0]
                        if verb not in verbs:
                            bad.append(f"{os.path.basename(path)}: tally {verb}: no such verb ({line.strip()[:80]})")
                            continue
                    rc, flags = self.flags_of(binary, verb)
                    for w in words:
                        if not w.startswith("--") or w == "--":
                            continue
                        name = w[2:].split("=")[0].replace("-", "_")
                        if name and name not in flags:
                            bad.append(f"{os.path.basename(path)}: {binary} {verb or ''} does not take --{name} "
                                       f"({line.strip()[:100]})")
                    checked += 1
        self.assertGreater(checked, 40)
        self.assertEqual(bad, [])

    def test_named_paths_and_suites_exist(self):
        suites = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(tt.SRC, "bench", "gpu", "*.sh"))} - {"lib", "run"}
        self.assertGreaterEqual(len(suites), 5)
        bad = []
        for path in DOCS:
            for line in code_lines(path):
                for rel in re.findall(r"(?<![\w/.-])((?:scripts|bench|examples|tests)/[\w./-]+\.(?:sh|py|cc|pt|csv))",
                                      line):
                    if not os.path.exists(os.path.join(tt.SRC, rel)):
                        bad.append(f"{os.path.basename(path)}: {rel}")
                for suite in re.findall(r"bench/gpu/run\.sh\s+([a-z0-9_]+)", line):
                    if suite not in suites:
                        bad.append(f"{os.path.basename(path)}: no suite '{suite}' in bench/gpu")
        self.assertEqual(bad, [])

    def test_every_current_figure_names_a_command(self):
        text = read(os.path.join(tt.SRC, "BENCHMARKS.md"))
        table = text[text.index("## Current figures"):]
        table = table[:table.index("\n## ", 5)]
        rows = [r for r in table.split("\n") if r.startswith("| ") and not r.startswith("| what")]
        self.assertGreater(len(rows), 10)
        for row in rows:
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            self.assertEqual(len(cells), 7, row)
            self.assertTrue(all(cells), row)
            self.assertRegex(cells[2], r"^20\d\d-\d\d-\d\d$", row)
            self.assertTrue(cells[3].startswith("`") or cells[3].startswith("the same"), row)


if __name__ == "__main__":
    unittest.main()
