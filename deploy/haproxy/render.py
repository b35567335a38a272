"""Write deploy/haproxy/haproxy.cfg for N replicas (one ``server`` line per replica in
each backend; HAProxy refuses a ``server`` whose address variable is unset, so the
configuration must list exactly the replicas there are).

    python deploy/haproxy/render.py --replicas 2 > haproxy.cfg

Replica ``rK`` is reached at ``${ACTORSERVE_RK_REST}`` and ``${ACTORSERVE_RK_GRPC}``.
The committed haproxy.cfg is this script's output for three replicas
(tests/e2e/test_deploy_haproxy.py checks that, and ``haproxy -c`` for 1, 2 and 3).
Standard library only: it runs wherever HAProxy's configuration is made.
"""

from __future__ import annotations

import argparse
import sys

HEADER = """\
# HAProxy in front of N actorserve replicas: every request of a sequence reaches the
# replica that holds it, over REST, SSE and gRPC (docs/deploy.md#haproxy).
#
# Generated for {n} replica(s) by `python deploy/haproxy/render.py --replicas {n}`: run it
# with your count (HAProxy refuses a `server` line whose address variable is unset), or
# use `server-template` with DNS in Kubernetes.
#
# Stickiness is learnt, not guessed: a stick table maps a sequence id to the replica
# that answered its start, stored from the response's `sequence-id` header (a
# client-chosen id or the server-made one, echoed on every answer of a sequence, gRPC
# initial metadata too; an error carries none, so a refused start is not stored).
# Later requests name the id in the `sequence-id` header (gRPC: metadata) and match:
# a client must send it on every request of a sequence (tritonclient.grpc puts the id
# in the message body only: see docs/deploy.md#clients).
#
# A draining replica (SIGTERM with --drain-timeout) fails its readiness check: it gets
# no new sequences, while `option persist` keeps its open ones on it until they end.
# A start that reaches it before the check noticed is refused 503 + Retry-After: the
# client retries, and the proxy sends the retry elsewhere.
# When a replica dies, `option redispatch` sends its sequences' requests to a live
# replica, which answers 404 / NOT_FOUND with reason `sequence_not_held` (never a
# fresh state): the client starts over. New sequences go to the live replicas.
#
# The addresses come from the environment (HAProxy expands "${{VAR}}"):
# ACTORSERVE_PROXY_REST, ACTORSERVE_PROXY_GRPC and, per replica rK, ACTORSERVE_RK_REST
# and ACTORSERVE_RK_GRPC. Checked in CI with `haproxy -c` (tests/e2e/test_deploy_haproxy.py).

global
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 10m
    timeout server 10m
    timeout tunnel 1h
    # a stuck sequence follows its replica even when its readiness check fails (a
    # draining replica still serves the sequences it holds) ...
    option persist
    # ... until it cannot be reached: then its requests go to a live replica, which
    # says `sequence_not_held`. Every retry may pick another replica.
    option redispatch 1
    retries 2

frontend rest
    bind "${{ACTORSERVE_PROXY_REST}}"
    default_backend actorserve_rest

frontend grpc
    bind "${{ACTORSERVE_PROXY_GRPC}}" proto h2
    default_backend actorserve_grpc

backend actorserve_rest
    balance roundrobin
    # sequence id -> replica; an entry outlives the sequence's idle timeout
    stick-table type string len 160 size 1m expire 1h
    stick match req.hdr(sequence-id)
    stick store-response res.hdr(sequence-id)
    # /v2/health/ready: a draining or loading replica gets no new work
    option httpchk GET /v2/health/ready
    http-check expect status 200
{rest}

backend actorserve_grpc
    # a gRPC port is as ready as its replica's REST readiness says (track)
    balance roundrobin
    stick-table type string len 160 size 1m expire 1h
    stick match req.hdr(sequence-id)
    stick store-response res.hdr(sequence-id)
{grpc}
"""

#: most replicas one configuration lists (a typo's guard, not HAProxy's limit)
MAX_REPLICAS = 1000


def render(replicas: int) -> str:
    """The configuration for ``replicas`` replicas, r1 to rN."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas must be 1 to {MAX_REPLICAS}, got {replicas}")
    names = [f"r{k}" for k in range(1, replicas + 1)]
    rest = "\n".join(
        f'    server {name} "${{ACTORSERVE_{name.upper()}_REST}}" check inter 1s fall 1 rise 2'
        for name in names
    )
    grpc = "\n".join(
        f'    server {name} "${{ACTORSERVE_{name.upper()}_GRPC}}" proto h2 track actorserve_rest/{name}'
        for name in names
    )
    return HEADER.format(n=replicas, rest=rest, grpc=grpc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, required=True, help="how many replicas (r1 to rN)")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(render(args.replicas))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
