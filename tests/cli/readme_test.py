#!/usr/bin/env python3
"""Runs the README's shell blocks that are marked runnable and checks their
printed output.

A block is runnable when the line before its ```sh fence is
`<!-- readme-test -->`, or `<!-- readme-test: llvm -->` for one that needs
kcache-demo (skipped, and said, when it was not built). Blocks that need a
network or a GPU are never marked. In a block, a line starting with `$ ` is
a command; the lines after it, up to the next command, are what it prints on
stdout, line for line, where `…` stands for any text (none listed: not
checked). A command ends with `# exit N` when N is its expected status,
else it must exit 0. Each block runs in one bash, so variables carry over,
in a folder where `build` is the build tree and the rest is the source tree
(so `build/tools/kcache` is spelled as the README spells it), with HOME,
XDG folders and TMPDIR of its own and no KCACHE_* variable of the caller.

usage: readme_test.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def blocks(readme):
    lines = open(readme, encoding="utf-8").read().split("\n")
    out = []
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- readme-test(?::\s*(\w+))? -->", line.strip())
        if not m or i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
            continue
        body = []
        for l in lines[i + 2:]:
            if l.strip() == "```":
                break
            body.append(l)
        out.append((i + 3, m.group(1) or "", body))
    return out


def commands(body):
    cmds = []
    for l in body:
        if l.startswith("$ "):
            cmds.append([l[2:], []])
        elif cmds:
            cmds[-1][1].append(l)
        elif l.strip():
            raise ValueError("output before any command: " + l)
    return cmds


def matches(pattern, text):
    rx = "".join(".*" if part == "…" else re.escape(part) for part in re.split("(…)", pattern))
    return re.fullmatch(rx, text, re.S) is not None


def run_block(first_line, body, work, env):
    cmds = commands(body)
    script = []
    for n, (cmd, _) in enumerate(cmds):
        script.append("{ %s\n} > %s/out.%d 2> %s/err.%d; echo $? > %s/rc.%d" % (cmd, work, n, work, n, work, n))
    r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work + "/tree", env=env, timeout=300)
    failures = []
    for n, (cmd, want) in enumerate(cmds):
        def read(name):
            try:
                return open("%s/%s.%d" % (work, name, n), encoding="utf-8").read()
            except FileNotFoundError:
                return None
        rc, out, err = read("rc"), read("out"), read("err")
        where = "README line %d: $ %s" % (first_line, cmd)
        if rc is None:
            failures.append(where + ": did not run (bash exited %d)" % r.returncode)
            continue
        m = re.search(r"#\s*exit\s+(\d+)\s*$", cmd)
        want_rc = int(m.group(1)) if m else 0
        if int(rc) != want_rc:
            failures.append("%s: exit %s, not %d; stderr: %s" % (where, rc.strip(), want_rc, err.strip()))
            continue
        if want:
            got = out.rstrip("\n").split("\n") if out else []
            if len(got) != len(want) or not all(matches(w, g) for w, g in zip(want, got)):
                failures.append("%s: printed\n%s\nnot as the README shows\n%s" % (where, out, "\n".join(want)))
    return failures


def main():
    src, build = sys.argv[1], sys.argv[2]
    have_llvm = os.access(os.path.join(build, "examples/jit/kcache-demo"), os.X_OK)
    failures, ran = [], 0
    for first_line, needs, body in blocks(os.path.join(src, "README.md")):
        if needs == "llvm" and not have_llvm:
            print("README line %d: skipped (kcache-demo not built: no LLVM)" % first_line)
            continue
        if needs not in ("", "llvm"):
            failures.append("README line %d: unknown need '%s'" % (first_line, needs))
            continue
        work = tempfile.mkdtemp(prefix="kcache-readme-")
        try:
            tree = os.path.join(work, "tree")
            os.mkdir(tree)
            for name in os.listdir(src):
                if name not in ("build", ".git"):
                    os.symlink(os.path.join(src, name), os.path.join(tree, name))
            os.symlink(os.path.abspath(build), os.path.join(tree, "build"))
            home = os.path.join(work, "home")
            tmp = os.path.join(work, "tmp")
            os.mkdir(home)
            os.mkdir(tmp)
            env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_") and not k.startswith("XDG_")}
            env.update(HOME=home, TMPDIR=tmp, LC_ALL="C.UTF-8")
            failures += run_block(first_line, body, work, env)
            ran += 1
        finally:
            shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    print("%d README block(s) run, %d failure(s)" % (ran, len(failures)))
    return 1 if failures or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
