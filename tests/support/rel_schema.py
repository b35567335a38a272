"""schemathesis against the served OpenAPI document (``GET /v2/docs/dataplane.json``):
every operation, valid and invalid requests generated from its schema, sent to a real
server; a tally of what came back. Used by ``tests/reliability/test_rel_badinput_schema.py``
(few examples, fixed seed) and ``benchmarks/reliability/fuzz.py`` (many, random).

Blocking (``requests`` underneath): run it in a worker thread beside a server in trio."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.reporting import with_reporter
from schemathesis import GenerationMode

#: TorchServe's paths: errors are ``{"code", "type", "message"}``
TORCHSERVE_PREFIXES = ("/ping", "/predictions/", "/explanations/", "/models")


@attrs.define
class Tally:
    """What the generated requests got back."""

    sent: int = 0
    statuses: Counter[int] = attrs.field(factory=Counter)
    #: (method path, status, what is wrong) for each answer breaking the rules
    problems: list[tuple[str, int, str]] = attrs.field(factory=list)
    #: requests that got no HTTP answer (connection reset, timeout)
    crashes: list[tuple[str, str]] = attrs.field(factory=list)
    operations: int = 0
    #: 501 from TorchServe's /explanations, which the document says are not implemented
    not_implemented: int = 0

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500) - self.not_implemented

    @property
    def non_json_4xx(self) -> int:
        return sum(
            1 for _, status, why in self.problems if 400 <= status < 500 and why.startswith("not a JSON")
        )


#: vLLM's routes beside /v1, which the OpenAI door serves (its error shape)
VLLM_ROUTES = ("/tokenize", "/detokenize", "/health", "/version")


def error_problem(path: str, status: int, body: bytes) -> str | None:
    """What is wrong with a 4xx/5xx body for ``path``'s route family (None: nothing)."""
    try:
        document = json.loads(body)
    except ValueError:
        return f"not a JSON error body: {body[:80]!r}"
    if status == 401:  # the token check answers every family alike (docs/security.md)
        ok = isinstance(document, dict) and isinstance(document.get("error"), str)
    elif path.startswith("/v1/") or path in VLLM_ROUTES:  # the OpenAI door's shape
        ok = (
            isinstance(document, dict)
            and isinstance(document.get("error"), dict)
            and isinstance(document["error"].get("message"), str)
        )
    elif path.startswith(TORCHSERVE_PREFIXES):
        ok = (
            isinstance(document, dict)
            and document.get("code") == status
            and isinstance(document.get("message"), str)
        )
    else:
        ok = isinstance(document, dict) and isinstance(document.get("error"), str)
    return None if ok else f"not the route's JSON error format: {body[:80]!r}"


def run_schema(
    document: dict[str, Any],
    base_url: str,
    *,
    examples: int,
    seed: int | None = 0,
    management_url: str | None = None,
    timeout: float = 10.0,
    skip: Callable[[str, str], bool] = lambda method, path: False,
    negative_everywhere: bool = False,
) -> Tally:
    """Every operation of ``document``: ``examples`` valid cases each, and ``examples``
    invalid ones (schemathesis's negative mode) for each operation with a JSON body (or,
    ``negative_everywhere``, for all: slow, hypothesis spends seconds per operation
    failing to make a path parameter that is not a string), against ``base_url`` (and
    TorchServe's ``/models`` paths against ``management_url`` too). ``seed`` None:
    random cases; else the same ones every run."""
    schema = schemathesis.openapi.from_dict(document)
    tally = Tally()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        method, path = operation.method.upper(), operation.path
        if skip(method, path):
            continue
        bases = [base_url]
        if management_url is not None and path.startswith("/models"):
            bases.append(management_url)
        json_body = any(  # a JSON body with a schema to break ({} takes anything)
            body.media_type == "application/json" and body.definition.get("schema") for body in operation.body
        )
        modes = [GenerationMode.POSITIVE]
        if json_body or negative_everywhere:
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            tally.operations += 1
            run = settings(
                max_examples=examples,
                deadline=None,
                derandomize=seed is not None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )(
                given(case=operation.as_strategy(generation_mode=mode))(
                    _sender(tally, session, bases=bases, name=f"{method} {path}", path=path, timeout=timeout)
                )
            )
            try:
                with with_reporter(lambda _: None):  # no "@seed(...)" lines for the skipped ones
                    run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
                tally.operations -= 1
    return tally


def _sender(
    tally: Tally, session: requests.Session, *, bases: list[str], name: str, path: str, timeout: float
) -> Callable[[Any], None]:
    def send(case: Any) -> None:
        _send(tally, session, case, bases=bases, name=name, path=path, timeout=timeout)

    return send


def _send(
    tally: Tally,
    session: requests.Session,
    case: Any,
    *,
    bases: list[str],
    name: str,
    path: str,
    timeout: float,
) -> None:
    for base in bases:
        tally.sent += 1
        try:
            response = case.call(base_url=base, session=session, timeout=timeout)
        except (requests.ConnectionError, requests.Timeout) as exc:
            tally.crashes.append((name, f"{type(exc).__name__}: {exc}"[:200]))
            continue
        status = response.status_code
        tally.statuses[status] += 1
        if status == 501 and path.startswith("/explanations/"):  # documented: not implemented
            tally.not_implemented += 1
        elif status >= 500:
            tally.problems.append(
                (f"{name} {case.path_parameters}", status, f"server error: {response.content[:160]!r}")
            )
        elif status >= 400 and (problem := error_problem(path, status, response.content)) is not None:
            tally.problems.append((f"{name} {case.path_parameters}", status, problem))
