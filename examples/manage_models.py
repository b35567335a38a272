"""Operate a running server: the repository index, Triton's model config and statistics
through tritonclient, and actorserve's management routes (describe, workers).

    python examples/manage_models.py [--http http://127.0.0.1:8080]

Runs one request on the built-in ``accumulator`` model, reads its config and statistics
with ``tritonclient.http``, scales it to two workers and back to one, then unloads and
reloads ``identity`` and shows it in the index meanwhile. Leaves the server as it found
it; exits 0 when every answer is as expected.

The management routes need the server's bearer token (docs/security.md): put it in
``ACTORSERVE_TOKEN``: the file the server's log names, ``$XDG_RUNTIME_DIR/actorserve/8080/token``
(without ``XDG_RUNTIME_DIR``, as in most containers: ``/tmp/actorserve-<uid>/8080/token``;
the README's ``export`` line reads either). Without it the example stops at the first
refused request and says so.
"""

from __future__ import annotations

import argparse
import sys
from urllib.parse import urlsplit

import httpx
import numpy as np
import tritonclient.http as httpclient
from example_token import AUTH, HOOKS, refused
from tritonclient.utils import InferenceServerException


def main(base_url: str) -> int:
    triton = httpclient.InferenceServerClient(urlsplit(base_url).netloc, network_timeout=30)
    checks: list[bool] = []
    with httpx.Client(base_url=base_url, timeout=30, headers=AUTH, event_hooks=HOOKS) as client:
        value = httpclient.InferInput("INPUT", [1], "INT64")
        value.set_data_from_numpy(np.array([5], dtype=np.int64), binary_data=False)
        triton.infer(
            "accumulator", [value], sequence_id=4242, sequence_start=True, sequence_end=True, headers=AUTH
        )

        config = triton.get_model_config("accumulator")
        print(
            f"config: max_batch_size={config['max_batch_size']} instances={config['instance_group'][0]['count']}"
        )
        stats = triton.get_inference_statistics("accumulator")["model_stats"][0]
        print(f"statistics: {stats['inference_stats']['success']['count']} successful request(s)")
        checks.append(stats["inference_stats"]["success"]["count"] >= 1)

        scaled = client.post("/v2/repository/models/accumulator/workers", json={"workers": 2}).json()
        print(f"scaled up: workers={scaled['workers']} replicas={len(scaled['replicas'])}")
        back = client.post("/v2/repository/models/accumulator/workers", json={"workers": 1}).json()
        print(f"scaled down: workers={back['workers']}")
        checks.append((scaled["workers"], back["workers"]) == (2, 1))

        triton.unload_model("identity", headers=AUTH)
        states = {m["name"]: (m["state"], m.get("reason", "")) for m in triton.get_model_repository_index()}
        print(f"after unload: identity is {states['identity']}")
        checks.append(states["identity"] == ("UNAVAILABLE", "unloaded"))
        triton.load_model("identity", headers=AUTH)
        checks.append(triton.is_model_ready("identity"))
        print(f"reloaded: identity ready={checks[-1]}")
    triton.close()
    print("ok" if all(checks) else f"unexpected: {checks}")
    return 0 if all(checks) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--http", default="http://127.0.0.1:8080", help="REST base URL of a running actorserve"
    )
    parser.add_argument("--grpc", help="ignored (this example uses REST)")
    args = parser.parse_args()
    try:
        sys.exit(main(args.http))
    except InferenceServerException as exc:  # tritonclient.http: our 401 says "unauthorized"
        if exc.message() != "unauthorized":
            raise
        refused(f"a tritonclient call ({exc.message()})")
