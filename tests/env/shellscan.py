"""Reads shell scripts for the commands they call, for tests/env/check-packages.py.

A heuristic tokenizer, not a shell: the first word of each simple command (after ; | & && || ( )
{ } and the keywords), past assignments, redirections and prefixes such as exec, setsid, nohup,
env. Quoted strings, comments and heredoc bodies are data; the command substitutions inside double
quotes, arithmetic and unquoted heredocs are scanned as commands. Case patterns, `for` word lists
and the insides of [[ ]] are skipped.
"""
import re

BUILTINS = set("""
: . [ [[ ]] alias bg bind break builtin caller cd command compgen complete compopt continue declare
dirs disown echo enable eval exec exit export false fc fg getopts hash help history jobs kill let local
logout mapfile popd printf pushd pwd read readarray readonly return set shift shopt source suspend
test times trap true type typeset ulimit umask unalias unset wait
""".split())
KEYWORDS = set("if then else elif fi do done while until for in case esac function select time { } ! coproc".split())
# Words that run the command after them (their own options skipped).
PREFIXES = {"exec", "setsid", "nohup", "env", "sudo", "time", "nice", "xargs", "builtin", "command"}
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
    if w == "type" and argv[:1] == ["-P"] and argv[1:]:
        return argv[1], []  # type -P NAME: the path of NAME, to be run
    if w in PREFIXES and not quoted:
        if w == "command" and argv[:1] and argv[0].startswith("-"):
            # command -v NAME: a lookup, counted as a use (the path it prints gets run)
            return (argv[1], []) if argv[0] in ("-v", "-V") and argv[1:] else (None, [])
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
