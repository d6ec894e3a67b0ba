#!/usr/bin/env bash
# Serving hosts on this machine, for the fleet proof (bench/fleet.sh) and the shared-cache
# measurement: each "host" is a network namespace with a veth link to this machine, its own
# sshd and its own dockerd (own --data-root, --exec-root, --pidfile and unix socket), and the
# local registry reachable as 127.0.0.1:5000 inside it (socat, over the namespace's link).
#
#   scripts/fleet-netns.sh up N      start hosts 1..N; prints the environment to source
#   scripts/fleet-netns.sh down      stop everything this script started, delete its data
#   scripts/fleet-netns.sh status
#   scripts/fleet-netns.sh restart-engine I [SIGNAL]   stop host I's dockerd (TERM, as systemd
#                                    does; KILL for a crash) and start it again on the same data
#
# SM120_FLEET_NAME (default sm120-fleet) and SM120_FLEET_NET (the second octet, default 231)
# give a second fleet its own namespaces, links and addresses beside this one (the fault and
# soak benches run theirs so), with SM120_FLEET_STATE and SM120_FLEET_DATA its own folders.
#
# Host i: namespace sm120-fleet-hI, address 10.231.I.2 (this machine: 10.231.I.1), engine at
# unix:///run/sm120-fleet/hI/docker.sock here and ssh://root@10.231.I.2 over ssh.
#
# Each dockerd keeps its default bridge: inside its own namespace that bridge is its own, so the
# pinned containers publish ports as on a real host. (A second dockerd in *this* namespace
# deleted the first engine's docker0 when it stopped: /work/shared/reference/environment.md.
# Its own namespace is what keeps the first engine whole; `down` checks that it is.)
#
# ssh: a key made for the run, held only by an ssh-agent started here (the key file is removed
# once it is loaded); the tool finds it as it would the user's agent. `ssh` is wrapped (bin/ssh
# under the state folder, first on PATH) to use a private known_hosts and config, so nothing of
# root's ~/.ssh is read or changed.
set -euo pipefail

NAME=${SM120_FLEET_NAME:-sm120-fleet}
NET=10.${SM120_FLEET_NET:-231}
STATE=${SM120_FLEET_STATE:-/run/$NAME}
DATA=${SM120_FLEET_DATA:-/var/lib/$NAME}
REGISTRY_PORT=${SM120_FLEET_REGISTRY_PORT:-5000}
PREFIX=$NAME-h
# Interface names have 15 characters at most: the default fleet keeps its old one.
LINK=$( [[ $NAME == sm120-fleet ]] && echo sm120f-h || echo "sm${NET#10.}-h")

say() { echo "fleet-netns: $*" >&2; }

ns() { echo "$PREFIX$1"; }

start_bg() {  # start_bg PIDFILE LOG CMD...: a daemon in its own session, its pid recorded
    local pidfile=$1 log=$2
    shift 2
    setsid "$@" >"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
}

wait_for() {  # wait_for SECONDS WHAT CMD...
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq "$seconds"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    say "timed out after ${seconds}s waiting for $what"
    return 1
}

client_setup() {
    local dir=$STATE/client
    mkdir -p "$dir/bin"
    chmod 700 "$dir"
    if [[ ! -S $dir/agent.sock ]]; then
        ssh-agent -a "$dir/agent.sock" >"$dir/agent.env"
        ssh-keygen -q -t ed25519 -N '' -C sm120-fleet -f "$dir/key"
        SSH_AUTH_SOCK=$dir/agent.sock ssh-add -q "$dir/key"
        cp "$dir/key.pub" "$dir/authorized_keys"
        rm -f "$dir/key" "$dir/key.pub"  # the agent holds it now; no key file stays behind
    fi
    cat >"$dir/ssh_config" <<EOF
Host $NET.*
    User root
    IdentityAgent $dir/agent.sock
    UserKnownHostsFile $dir/known_hosts
    StrictHostKeyChecking accept-new
    BatchMode yes
    ConnectTimeout 10
    LogLevel ERROR
EOF
    cat >"$dir/bin/ssh" <<EOF
#!/bin/sh
exec /usr/bin/ssh -F $dir/ssh_config "\$@"
EOF
    chmod 755 "$dir/bin/ssh"
}

engine_start() {  # engine_start I: host I's dockerd, in its namespace, on its own data
    local i=$1 dir=$STATE/h$i
    # nsenter enters the network namespace alone: `ip netns exec` also gives the process a
    # fresh /sys, without the cgroup mounts dockerd needs ("Devices cgroup isn't mounted").
    start_bg "$dir/dockerd.launcher.pid" "$dir/dockerd.log" \
        nsenter "--net=/run/netns/$(ns "$i")" dockerd \
        --data-root "$DATA/h$i" --exec-root "$dir/exec" --pidfile "$dir/docker.pid" \
        --host "unix://$dir/docker.sock" --insecure-registry "127.0.0.1:$REGISTRY_PORT" \
        --bip "172.31.$i.1/24" --default-address-pool "base=172.30.0.0/16,size=24"
}

host_up() {
    local i=$1 name dir data
    name=$(ns "$i")
    dir=$STATE/h$i
    data=$DATA/h$i
    if [[ -S $dir/docker.sock ]] && /usr/bin/docker -H "unix://$dir/docker.sock" version >/dev/null 2>&1; then
        say "host $i already up"
        return 0
    fi
    mkdir -p "$dir/exec" "$data" /run/sshd
    if ! ip netns list | grep -qw "$name"; then
        ip netns add "$name"
        ip link add "$LINK$i" type veth peer name eth0 netns "$name"
        ip addr add "$NET.$i.1/24" dev "$LINK$i"
        ip link set "$LINK$i" up
        ip netns exec "$name" ip link set lo up
        ip netns exec "$name" ip addr add "$NET.$i.2/24" dev eth0
        ip netns exec "$name" ip link set eth0 up
        ip netns exec "$name" ip route add default via "$NET.$i.1"
    fi
    # The registry, as 127.0.0.1:PORT inside the namespace (what pins and the engine name).
    start_bg "$dir/socat-host.pid" "$dir/socat-host.log" \
        socat "TCP-LISTEN:$REGISTRY_PORT,bind=$NET.$i.1,fork,reuseaddr" "TCP:127.0.0.1:$REGISTRY_PORT"
    start_bg "$dir/socat-ns.pid" "$dir/socat-ns.log" \
        nsenter "--net=/run/netns/$name" socat "TCP-LISTEN:$REGISTRY_PORT,bind=127.0.0.1,fork,reuseaddr" \
        "TCP:$NET.$i.1:$REGISTRY_PORT"
    engine_start "$i"
    [[ -f $dir/host_key ]] || ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
    cat >"$dir/sshd_config" <<EOF
ListenAddress $NET.$i.2
Port 22
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $STATE/client/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
# The host's engine for \`docker system dial-stdio\`, which ssh:// engine clients run here.
SetEnv DOCKER_HOST=unix://$dir/docker.sock
EOF
    nsenter "--net=/run/netns/$name" /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log"
    wait_for 60 "dockerd of host $i" /usr/bin/docker -H "unix://$dir/docker.sock" version
    say "host $i up: ssh://root@$NET.$i.2 (unix://$dir/docker.sock)"
}

kill_pidfile() {  # kill_pidfile FILE [SECONDS]: TERM, then KILL after SECONDS
    local file=$1 seconds=${2:-10} pid
    [[ -f $file ]] || return 0
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq "$seconds"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

host_down() {
    local i=$1
    local dir=$STATE/h$i
    kill_pidfile "$dir/sshd.pid"
    kill_pidfile "$dir/docker.pid" 60
    kill_pidfile "$dir/dockerd.launcher.pid"
    kill_pidfile "$dir/socat-ns.pid"
    kill_pidfile "$dir/socat-host.pid"
    if ip netns list | grep -qw "$(ns "$i")"; then
        ip netns pids "$(ns "$i")" | xargs -r kill -KILL 2>/dev/null || true
        ip netns del "$(ns "$i")"
    fi
    ip link del "$LINK$i" 2>/dev/null || true
    # Mounts dockerd made lived in its own mount namespace (ip netns exec), gone with it;
    # anything left under the data root here is unmounted before the data goes.
    grep -o " $DATA/h$i[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$DATA/h$i" "$dir"
}

main_engine_ok() {
    local image=${SM120_FLEET_CHECK_IMAGE:-local/debian-python:bookworm}
    if ip link show docker0 >/dev/null 2>&1 && docker run --rm --network host "$image" true \
        && docker run --rm "$image" true; then
        say "the main engine still runs containers (bridge docker0 present)"
    else
        say "WARNING: the main engine cannot run containers any more"
        return 1
    fi
}

case ${1:-} in
up)
    count=${2:-2}
    mkdir -p "$STATE"
    client_setup
    for i in $(seq "$count"); do host_up "$i"; done
    cat <<EOF
export SM120_FLEET_STATE=$STATE
export SSH_AUTH_SOCK=$STATE/client/agent.sock
export PATH=$STATE/client/bin:\$PATH
EOF
    ;;
down)
    for dir in "$STATE"/h*; do
        [[ -d $dir ]] && host_down "${dir##*/h}"
    done
    if [[ -f $STATE/client/agent.env ]]; then
        # shellcheck disable=SC1091
        (. "$STATE/client/agent.env" >/dev/null && ssh-agent -k >/dev/null) || true
    fi
    rm -rf "$STATE"
    rmdir "$DATA" 2>/dev/null || true
    main_engine_ok
    ;;
restart-engine)
    i=${2:?usage: $0 restart-engine I [SIGNAL]}
    dir=$STATE/h$i
    pid=$(cat "$dir/docker.pid")
    say "host $i: dockerd (pid $pid) stopped with SIG${3:-TERM}"
    kill "-${3:-TERM}" "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && { say "host $i: dockerd $pid did not stop"; exit 1; }
    rm -f "$dir/docker.pid"
    engine_start "$i"
    wait_for 60 "dockerd of host $i" /usr/bin/docker -H "unix://$dir/docker.sock" version
    say "host $i: dockerd started again (pid $(cat "$dir/docker.pid"))"
    ;;
status)
    ip netns list | grep "$PREFIX" || echo "no fleet namespaces"
    for dir in "$STATE"/h*; do
        [[ -S $dir/docker.sock ]] && /usr/bin/docker -H "unix://$dir/docker.sock" ps
    done
    ;;
*)
    echo "usage: $0 up [N] | down | status | restart-engine I [SIGNAL]" >&2
    exit 2
    ;;
esac
