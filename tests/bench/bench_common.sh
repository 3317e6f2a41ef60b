# Sourced by the bench scripts that time whole commands (bench_import.sh, bench_export.sh).
# Expects $work (a scratch folder) and $limit (seconds); $mem_limit (GB, optional) runs the
# command under ulimit -v.

# Runs a command under GNU time with the limits; prints "WALL_S RSS_MIB", or "timeout", or
# "failed(RC)" (and appends the command to $work/failures).
timed() {  # LOG CMD...
  local log="$1" rc=0
  shift
  (
    [ -n "${mem_limit:-}" ] && ulimit -v $((mem_limit * 1024 * 1024))
    exec timeout "$limit" /usr/bin/time -f '%e %M' -o "$work/time" "$@"
  ) >"$log" 2>&1 || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "timeout"; return; fi
  if [ "$rc" != 0 ]; then echo "failed($rc)"; echo "$*" >>"$work/failures"; return; fi
  awk '{printf "%.2f %.0f", $1, $2 / 1024}' "$work/time"
}

# The median (the lower middle of an even count) and the minimum of numbers on stdin; "-" if none.
median() { sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print "-"}'; }
minimum() { sort -n | awk 'NR == 1 {print $1} END {if (!NR) print "-"}'; }
