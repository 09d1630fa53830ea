# Shell helpers shared by the scripts that start servers on loopback ports
# (.ci/load-smoke.sh, .ci/interop.sh, .ci/cluster.sh, benches/peers/compare.sh,
# benches/cluster.sh). Source it;
# it defines functions and SERVER_PID, nothing runs.

# N distinct free loopback ports, chosen by the kernel: all N are held open
# together (so none repeats) and released just before use.
free_ports() { # N
    python3 -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))
for s in ss:
    s.close()' "$1"
}
free_port() { free_ports 1; }

# Waits until 127.0.0.1:PORT accepts a connection. Returns 0 when it does,
# 1 after SECONDS, 2 as soon as process PID is gone (the server died).
wait_port() { # PORT PID SECONDS
    local i
    for i in $(seq 1 $(($3 * 10))); do
        kill -0 "$2" 2>/dev/null || return 2
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# Stops one process: SIGTERM, up to 5 s to exit, then SIGKILL.
stop_pid() { # PID
    kill -0 "$1" 2>/dev/null || return 0
    kill -TERM "$1" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

# Stops the server in SERVER_PID (see stop_pid).
SERVER_PID=""
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        stop_pid "$SERVER_PID"
    fi
    SERVER_PID=""
}
