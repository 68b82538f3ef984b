#!/usr/bin/env bash
# expect.sh EXIT REGEX COMMAND...: runs COMMAND, passes when it exits with EXIT and its
# output (stdout and stderr) matches the extended REGEX.
set -u
want_exit=$1 regex=$2
shift 2
out=$("$@" 2>&1)
code=$?
if [ "$code" -ne "$want_exit" ]; then
  printf 'exit %s, expected %s; output:\n%s\n' "$code" "$want_exit" "$out"
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$out"; then
  printf 'output does not match /%s/:\n%s\n' "$regex" "$out"
  exit 1
fi
printf '%s\n' "$out" | tail -n 3
