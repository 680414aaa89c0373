#!/usr/bin/env bash
# Keeps development history out of the product: documents, manifests and sources state what holds
# now (history belongs to git). Prints every line that refers to a numbered or relative work
# period, an issue number, a machine named as "this" one, a commit hash, or a path outside the repository, and exits 1
# if there is any. Run by .ci/run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tests/env/need.sh
. tests/env/need.sh
need git

self=tests/no-diary.sh
ordinal='first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth'
hash='[0-9a-f]{7,40}'
patterns=(
  "\\b(${ordinal}|this|last|earlier|previous|next) session\\b"   # work periods
  "\\b(${ordinal}) session\\b|^#+ .*\\b(${ordinal})\\b.*session" # headings of work periods
  "\\bissues? #?[0-9]+\\b"                                       # issue numbers
  "\\b(this|earlier|previous|the new|the old) VM\\b"             # the machine a period ran on
  "\\bas before\\b"
  "\\bformer name\\b"
  "\\bcommits? \`?${hash}\\b"                                    # commit abc1234, commit \`abc1234\`
  "\\(\`${hash}\`"                                               # (\`abc1234\`, ...)
  "\\b(main|build|binary|code) (at|of) \`${hash}\`"              # main at \`abc1234\`
  "\\((BENCHMARKS|RELIABILITY|README|ARCHITECTURE)\\.md, (${ordinal}|[a-z]+th)\\b" # (BENCHMARKS.md, eleventh ...)
  "\\.\\./shared/|/work/"                                        # paths outside the repository
  # Upgrade notes for versions that were never released, and what the code once did.
  "\\bupgrading from (a|an|the|older|earlier) (version|release)"
  "\\bolder versions?\\b|\\bearlier versions?\\b|\\bthe old default\\b|\\bcan no longer be set\\b"
  "\\bit did once\\b|\\bused to (be|do|run|write|read|make)\\b"
  "\\b(created|made|installed) before (this|the) (default|change|release)\\b"
)
pattern=$(IFS='|'; echo "${patterns[*]}")

# Tracked files plus new ones not ignored, so a local run sees what CI will.
mapfile -d '' files < <(git ls-files -z --cached --others --exclude-standard -- \
  '*.md' '*.rs' '*.toml' '*.yaml' '*.yml' '*.sh' '*.tpl' '*.txt' '.ci/*' Dockerfile |
  grep -zv -e '^target/' -e '^Cargo\.lock$' -e "^${self}\$")
existing=()
for f in "${files[@]}"; do [[ -f $f ]] && existing+=("$f"); done

if hits=$(grep -nHIiE -- "$pattern" "${existing[@]}"); then
  echo "$hits"
  echo "tests/no-diary.sh: development history in the lines above; state the current fact instead (git keeps the history)" >&2
  exit 1
fi
echo "tests/no-diary.sh: no development history in ${#existing[@]} files"
