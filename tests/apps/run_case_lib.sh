# Shared setup of the launcher's end-to-end tests (test_run_preempt.sh, test_run_max_restarts.sh),
# sourced after their arguments are read. Gives: $tmp (removed at exit), and per case ($case the
# case's name, $log its output, $rc its exit code):
#   fail MESSAGE       count a failure of the case
#   expect PATTERN     the case's log contains PATTERN (extended regex)
#   expect_not PATTERN the case's log does not
#   leftovers          no process whose command line names $tmp is left
#   show               the case's exit code and log (without lines matching $show_skip, if set)
#   finish WHAT        exit 1 with the failure count, or say every WHAT case passed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
show_skip=${show_skip:-}
fail() {
  echo "FAIL: $case: $*"
  failures=$((failures + 1))
}
expect() {
  grep -qE -- "$1" "$log" || fail "output lacks '$1'"
}
expect_not() {
  ! grep -qE -- "$1" "$log" || fail "output has '$1'"
}
leftovers() {
  sleep 0.5
  local left
  left=$(pgrep -af -- "$tmp" | grep -v pgrep)
  [ -z "$left" ] || fail "processes left: $left"
}
show() {
  echo "--- $case: exit $rc"
  if [ -n "$show_skip" ]; then
    grep -vE -- "$show_skip" "$log" | sed 's/^/    /'
  else
    sed 's/^/    /' "$log"
  fi
}
finish() {
  if [ $failures -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
  fi
  echo "all $1 cases passed"
}
