#!/usr/bin/env bash
# Runs a command under a virtual X server (Mesa's software OpenGL); exit 77 (skipped) without
# xvfb-run. -noreset: Xvfb otherwise resets when its last client disconnects, and a test that
# opens the next window during the reset cannot open the display. CAI_GUI_REQUIRE_DISPLAY tells
# the tests that a display is there: failing to open a window is then a failure, not a skip.
if ! command -v xvfb-run >/dev/null 2>&1; then
  echo "skipped: xvfb-run not found (scripts/setup installs xvfb, xauth and libgl1-mesa-dri)"
  exit 77
fi
export CAI_GUI_REQUIRE_DISPLAY=1
exec xvfb-run -a -s "-screen 0 1280x800x24 -noreset" "$@"
