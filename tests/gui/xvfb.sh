#!/usr/bin/env bash
# Runs a command under a virtual X server (Mesa's software OpenGL); exit 77 (skipped) without
# xvfb-run.
if ! command -v xvfb-run >/dev/null 2>&1; then
  echo "skipped: xvfb-run not found (scripts/setup installs xvfb, xauth and libgl1-mesa-dri)"
  exit 77
fi
exec xvfb-run -a -s "-screen 0 1280x800x24" "$@"
