# Helpers shared by the GPU scripts (check.sh, cap_oom.sh, stacks.sh), sourced after each has set LOG (its full
# log), DEADLINE (seconds into the run after which nothing new starts) and, optionally, TMO_MIN (the shortest
# timeout a command gets, default 1).

log() { printf '%s\n' "$*" >>"$LOG"; }
say() { printf '[%3ds] %s\n' "$SECONDS" "$*" | tee -a "$LOG"; }
left() { echo $((DEADLINE - SECONDS)); }

# A timeout of at most $1 seconds that ends before the deadline (never under TMO_MIN).
tmo() {
    local want=$1 l
    l=$(left)
    ((l < want)) && want=$l
    ((want < ${TMO_MIN:-1})) && want=${TMO_MIN:-1}
    echo "$want"
}

# Ends processes a case left behind: those carrying its VT_CHECK_TAG (only processes this script started do).
reap() {
    local tag=$1 p pid
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [ "$pid" = "$$" ] && continue
        if grep -qxzF "VT_CHECK_TAG=$tag" "$p/environ" 2>/dev/null; then
            log "reaping leftover pid $pid: $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | cut -c1-160)"
            kill -KILL "$pid" 2>/dev/null
        fi
    done
}
