#!/usr/bin/env python3
"""Fails when a script calls a command that no install step provides.

    tests/env/check-packages.py [ROOT]     check the repository (default: the one this file is in)
    tests/env/check-packages.py --self-test

Every shell script under tests/, localstack/, deploy/ and .ci/ is read for the commands it calls
(a heuristic tokenizer: the first word of each simple command, after prefixes such as exec,
setsid, nohup and env; quoted strings and heredoc bodies are data, except the command
substitutions inside double quotes and unquoted heredocs). Rust `Command::new("...")` literals in
tests/, benches/ and providers/ count as commands tests/run.sh runs (through cargo test/bench).

A command is provided when it is
  - a shell builtin or keyword, a function the script (or a file it sources, or that sources it)
    defines, a repository script, or a variable;
  - in /usr/bin, /bin, /usr/sbin or /sbin from a Debian package marked Essential (dpkg -S,
    dpkg-query ${Essential}), which every Debian system has;
  - a toolchain or environment entry of tests/env/packages.txt (package `toolchain` or `env`);
  - a package entry of tests/env/packages.txt, and the script (or a file in its source group)
    runs `need` for it; a Rust literal needs `need` in tests/run.sh or a script it runs.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shellscan import BUILTINS, KEYWORDS, shell_calls  # noqa: E402

STD_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")
SCRIPT_DIRS = ("tests", "localstack", "deploy", ".ci")
RUST_DIRS = ("tests", "benches", "providers")


# ---- the list and Debian -------------------------------------------------------------------------
def read_list(path):
    entries = {}
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip() if raw.lstrip().startswith("#") else raw.strip()
            if not line:
                continue
            parts = line.split(None, 2)
            if len(parts) < 3:
                sys.exit(f"{path}:{n}: want `command package why`, got: {raw.rstrip()}")
            entries[parts[0]] = (parts[1], parts[2])
    return entries


class Debian:
    def __init__(self):
        self.cache = {}

    def owner(self, path):
        try:
            out = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True).stdout
        except FileNotFoundError:
            return None
        for ln in out.splitlines():
            if ln.startswith("diversion by"):
                continue
            if ":" in ln:
                return ln.split(":", 1)[0].split(",")[0].strip()
        return None

    def essential(self, command):
        """The Essential package that installs `command` in a standard directory, or None."""
        if command in self.cache:
            return self.cache[command]
        found = None
        paths = [command] if command.startswith("/") else [f"{d}/{command}" for d in STD_DIRS]
        for p in paths:
            cands = {p, os.path.realpath(p)} if os.path.exists(p) else {p}
            for q in list(cands):  # merged /usr: dpkg may know either spelling
                for a, b in (("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/")):
                    if q.startswith(a):
                        cands.add(b + q[len(a) :])
                    elif q.startswith(b):
                        cands.add(a + q[len(b) :])
            for q in sorted(cands):
                pkg = self.owner(q)
                if pkg:
                    r = subprocess.run(["dpkg-query", "-W", "-f=${Essential}", pkg], capture_output=True, text=True)
                    if r.stdout.strip() == "yes":
                        found = pkg
                        break
            if found:
                break
        self.cache[command] = found
        return found


# ---- the repository ------------------------------------------------------------------------------
def shell_scripts(root):
    out = []
    for top in SCRIPT_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [x for x in dirs if x not in ("target", ".git", "node_modules")]
            for f in files:
                p = os.path.join(d, f)
                if f.endswith(".sh"):
                    out.append(p)
                    continue
                try:
                    with open(p, "rb") as fh:
                        head = fh.readline(100)
                except OSError:
                    continue
                if re.match(rb"#!\s*(/usr)?/bin/(env\s+)?(ba)?sh\b", head):
                    out.append(p)
    return sorted(out)


def rust_literals(root):
    pat = re.compile(r'Command::new\(\s*"([^"]+)"\s*\)')
    out = []
    for top in RUST_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [x for x in dirs if x != "target"]
            for f in files:
                if f.endswith(".rs"):
                    p = os.path.join(d, f)
                    with open(p, encoding="utf-8", errors="replace") as fh:
                        for n, ln in enumerate(fh, 1):
                            for m in pat.finditer(ln):
                                out.append((p, n, m.group(1)))
    return out


def referenced_scripts(text, path, scripts):
    """Repository scripts a script names (sourced or run), resolved by the literal path tail:
    "$ROOT/tests/env/node.sh" is tests/env/node.sh, "$(dirname "$0")/need.sh" the one beside it."""
    text = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\$\([^)]*\)+", " ", text)
    found = set()
    for m in re.finditer(r"([A-Za-z0-9_./-]*/)?([A-Za-z0-9_.-]+\.sh)\b", text):
        tail = ((m.group(1) or "") + m.group(2)).lstrip("./")
        same_dir = os.path.join(os.path.dirname(path), m.group(2))
        if "/" not in tail and same_dir in scripts:
            found.add(same_dir)
            continue
        for s in scripts:
            if s.endswith("/" + tail) and s != path:
                found.add(s)
    return found


def sourced_scripts(text, path, scripts):
    found = set()
    for m in re.finditer(r"(?m)^\s*(?:\.|source)\s+(.+)$", text):
        found |= referenced_scripts(m.group(1), path, scripts)
    return found


def check(root, packages_path=None):
    root = os.path.abspath(root)
    packages_path = packages_path or os.path.join(root, "tests/env/packages.txt")
    entries = read_list(packages_path)
    debian = Debian()
    scripts = shell_scripts(root)
    texts = {s: open(s, encoding="utf-8", errors="replace").read() for s in scripts}
    parsed = {s: shell_calls(texts[s]) for s in scripts}
    sources = {s: sourced_scripts(texts[s], s, scripts) for s in scripts}
    # Source groups: a file, what it sources and what sources it share functions and `need`s.
    group = {s: {s} for s in scripts}
    changed = True
    while changed:
        changed = False
        for s in scripts:
            for t in list(sources[s]):
                merged = group[s] | group[t]
                if merged != group[s] or merged != group[t]:
                    for u in merged:
                        group[u] = merged
                    changed = True
    needs = {s: {a for _, name, argv in parsed[s][0] if name == "need" for a in argv} for s in scripts}
    funcs = {s: set() for s in scripts}
    for s in scripts:
        for t in group[s]:
            funcs[s] |= parsed[t][1]
    group_needs = {s: set().union(*(needs[t] for t in group[s])) for s in scripts}
    errors = []
    rel = lambda p: os.path.relpath(p, root)

    def provided(cmd, needed, where):
        """None when provided, else the reason it is not."""
        if cmd in entries:
            pkg, _ = entries[cmd]
            if pkg in ("toolchain", "env") or cmd in needed:
                return None
            return f"`{cmd}` (Debian package {pkg}) is called without `need {cmd}` in {where}"
        if debian.essential(cmd):
            return None
        return f"`{cmd}` is neither from an Essential Debian package nor in {rel(packages_path)}"

    for s in scripts:
        for line, name, argv in parsed[s][0]:
            if "\x00" in name or "$" in name or name in BUILTINS or name in KEYWORDS or name in funcs[s]:
                continue
            if not name.startswith("/") and "/" in name:
                continue  # a repository script or a built binary named by its path
            if not re.fullmatch(r"[A-Za-z0-9_./+-]+", name) or name == "need":
                continue
            why = provided(name, group_needs[s], "this script or a file in its source group")
            if why:
                errors.append(f"{rel(s)}:{line}: {why}")
        for a in needs[s]:
            if a not in entries:
                errors.append(f"{rel(s)}: `need {a}`: {a} is not in {rel(packages_path)}")

    # Rust literals: needed by tests/run.sh or a script it runs (transitively) before cargo test.
    run = os.path.join(root, "tests/run.sh")
    reach, todo = set(), [run] if run in texts else []
    while todo:
        s = todo.pop()
        if s in reach:
            continue
        reach.add(s)
        todo.extend(referenced_scripts(texts[s], s, scripts) | group[s])
    run_needs = set().union(*(needs[s] for s in reach)) if reach else set()
    for path, line, cmd in rust_literals(root):
        if "/" in cmd and not cmd.startswith("/"):
            continue
        why = provided(cmd, run_needs, "tests/run.sh or a script it runs")
        if why:
            errors.append(f"{rel(path)}:{line}: {why}")
    for cmd, (pkg, _) in entries.items():
        if pkg not in ("toolchain", "env") and not re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", pkg):
            errors.append(f"{rel(packages_path)}: `{cmd}`: `{pkg}` is not a Debian package name")
    return errors


# ---- self-test -----------------------------------------------------------------------------------
def self_test():
    cases = {
        "socat without need fails": ("#!/usr/bin/env bash\nsocat TCP-LISTEN:1 TCP:127.0.0.1:2\n", False),
        "socat with need passes": (
            '#!/usr/bin/env bash\n. "$(dirname "$0")/need.sh"\nneed socat\nsocat TCP-LISTEN:1 TCP:127.0.0.1:2\n',
            True,
        ),
        "socat in a command substitution fails": ('#!/usr/bin/env bash\nx="$(socat -V)"\n', False),
        "socat after setsid nohup fails": ("#!/usr/bin/env bash\nsetsid nohup socat - - &\n", False),
        "the path of socat to run fails": ('#!/usr/bin/env bash\nln -s "$(command -v socat)" fwd\n', False),
        "socat in a pipeline fails": ("#!/usr/bin/env bash\necho x | socat - TCP:1.2.3.4:5\n", False),
        "socat in a case branch fails": ('#!/usr/bin/env bash\ncase "$1" in\n  a) socat - - ;;\nesac\n', False),
        "an unlisted command fails": ("#!/usr/bin/env bash\nno-such-tool-anywhere --x\n", False),
        "data is not a command": (
            "#!/usr/bin/env bash\necho 'socat in quotes'; cat <<'EOF'\nsocat in a heredoc\nEOF\n"
            "# socat in a comment\ncase x in socat) : ;; esac\nfor socat in a b; do :; done\n",
            True,
        ),
        "functions and Essential commands pass": ("#!/usr/bin/env bash\nf() { sed -n 1p; }\nf | grep -q x\n", True),
        "a toolchain passes": ("#!/usr/bin/env bash\ncargo build\n", True),
        "a function from a sourced file passes": (
            '#!/usr/bin/env bash\n. "$(dirname "$0")/need.sh"\nneed_helper\n',
            True,
        ),
    }
    need_sh = "need() { :; }\nneed_helper() { :; }\n"
    listing = "socat socat a relay\ncargo toolchain Rust\n"
    failed = []
    for name, (script, want_pass) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(f"{d}/tests/env")
            with open(f"{d}/tests/env/packages.txt", "w") as f:
                f.write(listing)
            with open(f"{d}/tests/env/need.sh", "w") as f:
                f.write(need_sh)
            with open(f"{d}/tests/env/sample.sh", "w") as f:
                f.write(script)
            errors = check(d)
            if (not errors) != want_pass:
                failed.append(f"{name}: {'passed' if not errors else 'failed'} ({'; '.join(errors) or 'no errors'})")
    # A Rust literal counts only when tests/run.sh (or what it runs) needs the command.
    for with_need in (False, True):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(f"{d}/tests/env")
            with open(f"{d}/tests/env/packages.txt", "w") as f:
                f.write(listing)
            with open(f"{d}/tests/env/need.sh", "w") as f:
                f.write(need_sh)
            with open(f"{d}/tests/env/peers.sh", "w") as f:
                f.write('. "$(dirname "$0")/need.sh"\n' + ("need socat\n" if with_need else ""))
            with open(f"{d}/tests/run.sh", "w") as f:
                f.write("#!/usr/bin/env bash\ntests/env/peers.sh\ncargo test\n")
            with open(f"{d}/tests/relay.rs", "w") as f:
                f.write('fn f() { std::process::Command::new("socat").spawn(); }\n')
            errors = check(d)
            if (not errors) != with_need:
                failed.append(f"Rust socat {'with' if with_need else 'without'} need in run.sh: {errors or 'no errors'}")
    failed += need_self_test()
    for f in failed:
        print(f"check-packages self-test FAILED: {f}", file=sys.stderr)
    if failed:
        return 1
    print(f"check-packages self-test: {len(cases) + 2} check cases and need.sh's answers as expected")
    return 0


def need_self_test():
    """tests/env/need.sh against a list of its own, never installing: as a user other than root
    it names the packages to install instead."""
    need_sh = os.path.join(os.path.dirname(os.path.abspath(__file__)), "need.sh")
    listing = (
        "# comment lines and blank lines are skipped\n\n"
        "no-such-tool-x   toolchain   a prerequisite\n"
        "no-such-cmd-y    env         built by the environment\n"
        "no-such-cmd-z    some-package  a package\n"
        "/no/such/path    path-package  a file\n"
    )
    cases = [  # (arguments, exit status, what stderr must say)
        ("sh sed", 0, ""),
        ("no-such-unlisted", 1, "is not in"),
        ("no-such-tool-x", 1, "a prerequisite"),
        ("no-such-cmd-y", 1, "tests/env.sh up"),
        ("sh no-such-cmd-z /no/such/path", 1, "apt-get install some-package path-package"),
    ]
    failed = []
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/packages.txt", "w") as f:
            f.write(listing)
        for args, want_rc, want_err in cases:
            script = f'. "$1"; id() {{ echo 1000; }}; need {args}'
            r = subprocess.run(
                ["bash", "-c", script, "need-test", need_sh],
                env={**os.environ, "NEED_LIST": f"{d}/packages.txt"},
                capture_output=True,
                text=True,
            )
            if r.returncode != want_rc or want_err not in r.stderr:
                failed.append(f"need {args}: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    return failed


def main():
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(
            "check-packages: add the command to tests/env/packages.txt and `need` it in the script "
            "(tests/env/need.sh), at the step that calls it",
            file=sys.stderr,
        )
        sys.exit(1)
    print(f"check-packages: every command the scripts call is provided ({len(shell_scripts(os.path.abspath(root)))} scripts)")


if __name__ == "__main__":
    main()
