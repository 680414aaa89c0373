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

BUILTINS = set("""
: . [ [[ ]] alias bg bind break builtin caller cd command compgen complete compopt continue declare
dirs disown echo enable eval exec exit export false fc fg getopts hash help history jobs kill let local
logout mapfile popd printf pushd pwd read readarray readonly return set shift shopt source suspend
test times trap true type typeset ulimit umask unalias unset wait
""".split())
KEYWORDS = set("if then else elif fi do done while until for in case esac function select time { } ! coproc".split())
# Words that run the command after them (their own options skipped).
PREFIXES = {"exec", "setsid", "nohup", "env", "sudo", "time", "nice", "xargs", "builtin", "command"}
STD_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")
SCRIPT_DIRS = ("tests", "localstack", "deploy", ".ci")
RUST_DIRS = ("tests", "benches", "providers")
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
REDIR = re.compile(r"^(\{[A-Za-z_][A-Za-z0-9_]*\}|[0-9]*)?(>>|>&|<&|<<<|&>|>\||<>|>|<)")
HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


# ---- shell tokenizer ---------------------------------------------------------------------------
class Scan:
    """Splits shell text into simple commands (lists of words); quoted text is kept out of words'
    command position, and command substitutions anywhere are scanned as their own text."""

    def __init__(self, text):
        self.commands = []  # list of (line, [words])
        self.subs = []  # (line, text) of command substitutions to scan separately
        self.text = text
        self.tokenize()

    def tokenize(self):
        text, i, n, line = self.text, 0, len(self.text), 1
        words, word, quoted = [], "", False
        cur_line = 1

        def end_word():
            nonlocal word, quoted
            if word or quoted:
                words.append((word, quoted))
            word, quoted = "", False

        def end_command(sep):
            end_word()
            if words:
                self.commands.append((cur_line, list(words)))
            words.clear()
            if sep:
                self.commands.append((line, [(sep, False)]))

        while i < n:
            c = text[i]
            if not words and not word:
                cur_line = line
            if c == "\n":
                end_command(None)
                line += 1
                i += 1
            elif c == "\\" and i + 1 < n:
                if text[i + 1] == "\n":
                    line += 1
                else:
                    word += text[i + 1]
                i += 2
            elif c == "#" and not word:
                while i < n and text[i] != "\n":
                    i += 1
            elif c == "'":
                j = text.find("'", i + 1)
                j = n if j < 0 else j
                line += text.count("\n", i, j)
                word += text[i + 1 : j]
                quoted = True
                i = j + 1
            elif c == '"':
                j = self.skip_double(i + 1, line)
                line += text.count("\n", i, j)
                word += "\x00"  # quoted content: never a plain command name
                quoted = True
                i = j + 1
            elif c == "`":
                j = text.find("`", i + 1)
                j = n if j < 0 else j
                self.subs.append((line, text[i + 1 : j]))
                line += text.count("\n", i, j)
                word += "\x00"
                i = j + 1
            elif c == "$" and text.startswith("$((", i):
                j = self.match_paren(i + 1)
                self.subs.append((line, self.inner_subs(text[i + 3 : j - 1])))
                line += text.count("\n", i, j)
                word += "\x00"
                i = j + 1
            elif c == "$" and text.startswith("$(", i):
                j = self.match_paren(i + 1)
                self.subs.append((line, text[i + 2 : j]))
                line += text.count("\n", i, j)
                word += "\x00"
                i = j + 1
            elif c == "$" and text.startswith("${", i):
                j = self.match_brace(i + 1)
                line += text.count("\n", i, j)
                word += "\x00"
                i = j + 1
            elif c in "<>" and text.startswith("(", i + 1):  # process substitution
                j = self.match_paren(i + 1)
                end_word()
                self.subs.append((line, text[i + 2 : j]))
                line += text.count("\n", i, j)
                words.append(("\x00", True))
                i = j + 1
            elif c == "(" and text.startswith("((", i) and not word:
                j = self.match_paren(i)
                self.subs.append((line, self.inner_subs(text[i + 2 : j - 1])))
                line += text.count("\n", i, j)
                end_word()
                words.append(("((", False))
                i = j + 1
            elif c in ";|&()" or (c in "{}" and not word and self.is_brace_word(i)):
                if c == "&" and word and word[-1] in "<>":  # >&2, <&0
                    word += c
                    i += 1
                    continue
                op = c
                if text.startswith(";;", i) or text.startswith("&&", i) or text.startswith("||", i):
                    op = text[i : i + 2]
                if c == "(" and word and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_:.-]*", word):
                    # name() { ... }: a function definition; `()` is part of the word
                    k = text.find(")", i)
                    word += "()"
                    i = k + 1
                    continue
                if c == "(" and word.endswith("="):  # arr=(a b c)
                    j = self.match_paren(i)
                    word += "\x00"
                    line += text.count("\n", i, j)
                    i = j + 1
                    continue
                end_command(op)
                i += len(op)
            elif c in " \t":
                end_word()
                i += 1
            else:
                word += c
                i += 1
        end_command(None)

    def is_brace_word(self, i):
        nxt = self.text[i + 1 : i + 2]
        return nxt in ("", " ", "\t", "\n", ";")

    def skip_double(self, i, line):
        text, n = self.text, len(self.text)
        while i < n and text[i] != '"':
            if text[i] == "\\":
                i += 2
                continue
            if text.startswith("$((", i):
                i = self.match_paren(i + 1) + 1
                continue
            if text.startswith("$(", i):
                j = self.match_paren(i + 1)
                self.subs.append((line + text.count("\n", 0, i) - text.count("\n", 0, i), text[i + 2 : j]))
                i = j + 1
                continue
            if text[i] == "`":
                j = text.find("`", i + 1)
                self.subs.append((line, text[i + 1 : j]))
                i = j + 1
                continue
            i += 1
        return i

    def inner_subs(self, text):
        """Command substitutions inside arithmetic, as one text of commands."""
        out, i = [], 0
        while True:
            i = text.find("$(", i)
            if i < 0:
                return "\n".join(out)
            if text.startswith("$((", i):
                i += 3
                continue
            j = Scan.match_in(text, i + 1)
            out.append(text[i + 2 : j])
            i = j + 1

    def match_paren(self, i):
        return Scan.match_in(self.text, i)

    @staticmethod
    def match_in(text, i):
        """text[i] == '(': index of its matching ')', skipping quotes."""
        depth, n = 0, len(text)
        while i < n:
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == "'":
                i = text.find("'", i + 1)
                if i < 0:
                    return n
            elif c == '"':
                i += 1
                while i < n and text[i] != '"':
                    if text[i] == "\\":
                        i += 1
                    elif text.startswith("$(", i):
                        i = Scan.match_in(text, i + 1)
                    i += 1
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        return n

    def match_brace(self, i):
        depth, text, n = 0, self.text, len(self.text)
        while i < n:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        return n


def strip_heredocs(text):
    """Heredoc bodies become blank lines (line numbers kept); the command substitutions of unquoted
    bodies are returned to be scanned."""
    lines, out, subs, i = text.split("\n"), [], [], 0
    while i < len(lines):
        ln = lines[i]
        out.append(ln)
        i += 1
        code = ln if "#" not in ln else re.sub(r"(^|\s)#.*$", "", ln)
        for dash, quote, delim in HEREDOC.findall(code):
            start = i
            while i < len(lines) and (lines[i].lstrip("\t") if dash else lines[i]) != delim:
                i += 1
            body = "\n".join(lines[start:i])
            if not quote:
                j = 0
                while (j := body.find("$(", j)) >= 0:
                    if body.startswith("$((", j):
                        j += 3
                        continue
                    k = Scan.match_in(body, j + 1)
                    subs.append((start + 1 + body.count("\n", 0, j), body[j + 2 : k]))
                    j = k + 1
            out.extend([""] * (i - start))
            if i < len(lines):
                out.append("")
                i += 1
    return "\n".join(out), subs


def shell_calls(text, base_line=1):
    """(line, command, args) for every simple command, and the function names defined."""
    text, hsubs = strip_heredocs(text)
    scan = Scan(text)
    calls, funcs = [], set()
    mode = "cmd"  # cmd | case-word | case-pattern | for-words | test
    for ln, words in scan.commands:
        line = base_line + ln - 1
        k = 0
        while k < len(words):
            w, quoted = words[k]
            if mode == "case-word":
                if w == "in" and not quoted:
                    mode = "case-pattern"
                k += 1
                continue
            if mode == "case-pattern":
                if w == ")":
                    mode = "cmd"
                elif w == "esac":
                    mode = "cmd"
                k += 1
                continue
            if mode == "for-words":
                if w in ("do", ";") and not quoted:
                    mode = "cmd"
                k += 1
                continue
            if mode == "test":
                if w == "]]":
                    mode = "cmd"
                k += 1
                continue
            if w in (";;", ";&", ";;&"):
                mode = "case-pattern"
                k += 1
                continue
            if w in (";", "|", "&", "&&", "||", "(", ")", "((") or w in KEYWORDS and not quoted:
                if w == "case":
                    mode = "case-word"
                elif w in ("for", "select"):
                    mode = "for-words"
                k += 1
                continue
            if w == "[[" and not quoted:
                mode = "test"
                k += 1
                continue
            if w.endswith("()") and not quoted:
                funcs.add(w[:-2])
                k += 1
                continue
            # A simple command: assignments and redirections first, then the name.
            rest = words[k:]
            k = len(words)
            args = []
            j = 0
            while j < len(rest):
                rw, rq = rest[j]
                if rw in (";", "|", "&", "&&", "||", ")", ";;") and not rq:
                    k = len(words) - len(rest) + j
                    break
                args.append(rest[j])
                j += 1
            name, argv = command_of(args)
            if name == "function" and argv:
                funcs.add(argv[0].rstrip("()"))
            elif name is not None:
                calls.append((line, name, argv))
                if name == "case":
                    mode = "case-word"
    for ln, sub in scan.subs + hsubs:
        sub_calls, sub_funcs = shell_calls(sub, base_line + ln - 1)
        calls.extend(sub_calls)
        funcs |= sub_funcs
    return calls, funcs


def command_of(words):
    """The command a simple command runs (None when it runs none) and its literal arguments."""
    i = 0
    while i < len(words):
        w, quoted = words[i]
        if ASSIGN.match(w):
            i += 1
        elif REDIR.match(w):
            # `>file` or `> file`
            i += 1 if REDIR.sub("", w) else 2
        else:
            break
    words = words[i:]
    if not words:
        return None, []
    w, quoted = words[0]
    argv, skip = [], False
    for a, q in words[1:]:
        if skip:
            skip = False
        elif REDIR.match(a):
            skip = not REDIR.sub("", a)  # `> file`: the file is the next word
        else:
            argv.append(a)
    if w in PREFIXES and not quoted:
        if w == "command" and argv[:1] and argv[0].startswith("-"):
            return None, []  # command -v: a lookup, not a call
        rest = words[1:]
        while rest and (rest[0][0].startswith("-") or ASSIGN.match(rest[0][0])):
            opt = rest[0][0]
            rest = rest[1:]
            if w == "env" and opt in ("-u",) and rest:
                rest = rest[1:]
        if w == "time" and not rest:
            return None, []
        return command_of(rest) if rest else (None, [])
    return w, argv


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
        for t in group[s]:
            pass
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
    for f in failed:
        print(f"check-packages self-test FAILED: {f}", file=sys.stderr)
    if failed:
        return 1
    print(f"check-packages self-test: {len(cases) + 2} cases as expected")
    return 0


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
