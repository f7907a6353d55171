#!/usr/bin/env bash
# The house habits of issue 28, for the test command (2-5 s, no network,
# python3 only):
#   - no tracked *.rs / *.c source file over 1,200 lines (tests, fuzz targets
#     and generated files excepted: the list and the reason for each are at
#     the top of scripts/check_habits.py, EXEMPT);
#   - no import circle between the modules of one crate (every strongly
#     connected component of the `use crate::/super::/self::` graph is
#     printed with the file:line of each edge);
#   - no module importing an item from its parent (or any ancestor) module;
#   - one fact, one place: the MPA key (RFC 5044 §7.1) spelled out only in
#     iwarp-proto (tests and fuzz targets excepted);
#   - no application-level wait loop outside the verbs crate (its own
#     poll(2), sliced verbs waits, sleeps after a poll, WakePolicy): every
#     application waits through iwarp::wait::WaitSet (docs/WAITING.md).
# Known offenders are listed, each with its issue number, in
# scripts/habits-allow.txt; anything not listed fails.
#
# Usage: scripts/check-habits.sh [--root DIR] [--allow FILE] [--list] [--graph]
#   --list   print every offender as an allow-list line and exit 0
#   --graph  print every module edge the check sees
#   --self-test  run the checker against fake crates in a temp dir
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if ! command -v python3 >/dev/null; then
    echo "check-habits: python3 is missing: apt-get install python3" >&2
    exit 2
fi

case "${1:-}" in
-h | --help)
    sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
--self-test)
    exec python3 "$here/check_habits_selftest.py"
    ;;
esac

if [ "$#" -eq 0 ]; then
    set -- --root "$here/.."
fi
exec python3 "$here/check_habits.py" "$@"
