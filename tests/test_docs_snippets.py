"""Every ```bash and ```python block of the README and docs/*.md runs against a real
server, so the docs cannot rot: a block either runs, or is in :data:`SKIP` with the reason
it cannot run here.

One ``python -m actorserve`` (built-in models, one process, ports picked at start) serves
every block; ``127.0.0.1:8080`` / ``localhost:8080`` in a block become its REST address,
``...:8081`` its gRPC one. The management token is where the README says it is
(``$XDG_RUNTIME_DIR/actorserve/<port>/token``, a folder of this test's own; a block that
reads it runs again without ``XDG_RUNTIME_DIR``, as in most containers, where the file is
``$TMPDIR/actorserve-<uid>/<port>/token``). A bash block
runs as one ``bash -e -o pipefail`` script, its ``curl`` failing on an HTTP error status
(``--fail-with-body`` in a ``.curlrc``), and each stream it leaves running must end
well too; what the doc shows as a command's output (the
``# ...`` lines right under it, or an inline ``# {...}``) must be exactly what it printed
(a last ``# ...`` line: the output starts with the lines above it). A python block runs as
a script with this checkout first on ``sys.path``. Each block must exit 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest
from support.programs import require_program
from support.servers import start_server

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STARTUP_TIMEOUT = 60.0
SNIPPET_TIMEOUT = 60.0
#: printed after each command of a bash block, to split the output by command
MARK = "<<end of command>>"

#: (file, the block's first line) -> why it does not run here
SKIP: dict[tuple[str, str], str] = {
    (
        "README.md",
        "python3 -m venv .venv",
    ): "makes a virtual environment and runs the whole suite: CI's fresh-clone job",
    (
        "docs/getting-started.md",
        "python3 -m venv .venv",
    ): "the README's install line again (CI's fresh-clone job)",
    ("docs/torchserve.md", "pip install -e '.[torchserve]'"): "installs packages and needs a model store",
    (
        "README.md",
        ".venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
    ): "installs torch from the network, for a machine without this project's offline wheel",
    ("docs/torchserve.md", "python -m actorserve ./model_store"): "needs a model store and fixed ports",
    (
        "docs/deploy.md",
        "docker run -p 4318:4318 otel/opentelemetry-collector:latest",
    ): "runs a collector's container image (docker and the network); the spans' export is tested by "
    "tests/e2e/test_tracing_multiprocess.py against a collector of its own",
    (
        "docs/deploy.md",
        "python -c 'import secrets; print(secrets.token_urlsafe(32))' > management",
    ): "makes a Kubernetes Secret: needs kubectl and a cluster",
    (
        "docs/getting-started.md",
        "async with actorserve.open_engine()",
    ): "a sketch of two lines, not a program",
    ("docs/grpc.md", "from actorserve.server.doors import serve_grpc"): "a fragment of an async function",
    ("docs/rest.md", "import httpx, json"): "a fragment: url and inference_request are the reader's",
    ("docs/writing-a-model.md", "StepOutput(response=None"): "a signature sketch, not code",
    ("docs/writing-a-model.md", "class Streamer(Model):"): "a fragment of a class",
    ("docs/writing-a-model.md", "class Classifier(Model):"): "a fragment of a class",
    ("docs/writing-a-model.md", "async with actorserve.open_engine(["): "a fragment of an async function",
}
#: (file, first line) of the blocks that read the token from ACTORSERVE_TOKEN, as the
#: README's ``export`` leaves it (the others read the file where the README says it is)
WITH_TOKEN: set[tuple[str, str]] = {("docs/management.md", "import json, os, tritonclient.http")}
#: python blocks that go on from an earlier block of the same file (its first line)
CONTINUES: dict[tuple[str, str], str] = {
    (
        "docs/openai.md",
        "first = client.chat.completions.with_raw_response.create(",
    ): "from openai import OpenAI",
}
#: (file, first line) -> a pattern the block's output must not hold
NOT_PRINTED: dict[tuple[str, str], str] = {
    ("docs/openai.md", "from openai import OpenAI"): r"None\s*CompletionUsage",  # the stream's last delta
}


@attrs.frozen
class Snippet:
    path: str
    line: int
    language: str
    code: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.path, self.code.lstrip().splitlines()[0])

    def matches(self, table: dict[tuple[str, str], str]) -> str | None:
        path, first = self.key
        for (p, prefix), value in table.items():
            if p == path and first.startswith(prefix):
                return value
        return None


def snippets() -> list[Snippet]:
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        start = None
        for number, line in enumerate(lines, 1):
            fence = re.fullmatch(r"\s*```(\w*)\s*", line)
            if fence is None:
                continue
            if start is None:
                start, language = number, fence[1]
            else:
                if language in ("bash", "python"):
                    body = "\n".join(lines[start : number - 1])
                    indent = min(len(x) - len(x.lstrip()) for x in body.splitlines() if x.strip())
                    code = "\n".join(x[indent:] for x in body.splitlines())
                    found.append(Snippet(str(doc.relative_to(ROOT)), start, language, code))
                start = None
    return found


SNIPPETS = snippets()


@attrs.frozen
class Running:
    http: str
    grpc: str
    #: the snippets' environment (no ACTORSERVE_TOKEN: the docs say where to read it)
    env: dict[str, str]
    token: str
    #: the same without XDG_RUNTIME_DIR: the token file is under TMPDIR instead
    env_without_runtime_dir: dict[str, str]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    server = start_server("--http-port", "0", "--grpc-port", "0", "--api-workers", "0")
    try:
        http = server.wait_for(r"REST listening on http://(\S+)", STARTUP_TIMEOUT)[1]
        grpc = server.wait_for(r"gRPC listening on (\S+:\d+)")[1]
        token_file = Path(server.wait_for(r"management token generated: .* token in (\S+)")[1])
        runtime = tmp_path_factory.mktemp("run")
        runtime.chmod(0o700)
        folder = runtime / "actorserve" / http.rpartition(":")[2]
        folder.mkdir(parents=True, mode=0o700)
        shutil.copy(token_file, folder / "token")  # where the README says it is
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACTORSERVE_")}
        env.update(XDG_RUNTIME_DIR=str(runtime), PYTHONPATH=str(ROOT), NO_PROXY="127.0.0.1,localhost")
        # curl fails on an HTTP error (as a reader would see it fail), not only on no answer
        curl_home = tmp_path_factory.mktemp("curl")
        (curl_home / ".curlrc").write_text("--fail-with-body\n")
        env["CURL_HOME"] = str(curl_home)
        # where the server puts it without XDG_RUNTIME_DIR: <tmp>/actorserve-<uid>/<port>/token
        tmp = tmp_path_factory.mktemp("tmp")
        fallback = tmp / f"actorserve-{os.getuid()}" / http.rpartition(":")[2]
        fallback.mkdir(parents=True, mode=0o700)
        shutil.copy(token_file, fallback / "token")
        bare = {k: v for k, v in env.items() if k != "XDG_RUNTIME_DIR"}
        bare["TMPDIR"] = str(tmp)
        yield Running(http, grpc, env, token_file.read_text().strip(), bare)
    finally:
        server.stop()


def localized(code: str, running: Running) -> str:
    http_port = running.http.rpartition(":")[2]
    code = re.sub(r"\b(127\.0\.0\.1|localhost):8080\b", running.http, code)
    code = re.sub(r"\b(127\.0\.0\.1|localhost):8081\b", running.grpc, code)
    # the token file's folder is named after the REST port (a path, or Path / "8080" / "token")
    return re.sub(r"\b8080(?=/token\b|\" / \"token\")", http_port, code)


def bash_commands(code: str) -> list[tuple[str, list[str]]]:
    """The block's commands (continuation lines joined), each with its documented output."""
    commands: list[tuple[str, list[str]]] = []
    pending = ""
    for line in code.splitlines():
        if pending:
            pending += "\n" + line
        elif line.startswith("#"):
            if commands:  # a comment under a command: what it prints
                commands[-1][1].append(line[2:] if line.startswith("# ") else line[1:])
            continue
        else:
            pending = line
        if pending.endswith("\\") or quoted(pending):
            continue
        shown: list[str] = []
        inline = re.search(r"\s#\s*([{\[].*)$", pending)
        if inline is not None:
            shown.append(inline[1])
        commands.append((pending, shown))
        pending = ""
    return commands


def quoted(text: str) -> bool:
    """``text`` ends inside a quoted string (a command that goes on on the next line)."""
    quote = ""
    escaped = False
    previous = "\n"
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and previous.isspace():  # a comment: its quotes are prose
            return False
        previous = char
    return bool(quote)


def check_output(snippet: Snippet, command: str, shown: list[str], printed: str) -> None:
    lines = printed.rstrip("\n").split("\n")
    if shown and shown[-1] == "...":
        want = shown[:-1]
        assert lines[: len(want)] == want, f"{snippet.path}:{snippet.line}: {command}"
    elif shown:
        assert lines == shown, f"{snippet.path}:{snippet.line}: {command}"


def reload_identity(running: Running) -> None:
    """Blocks that unload ``identity`` (to show the token) leave it loaded for the next."""
    with httpx.Client(base_url=f"http://{running.http}", timeout=30) as client:
        if client.get("/v2/models/identity/ready").status_code != 200:
            auth = {"Authorization": f"Bearer {running.token}"}
            assert client.post("/v2/repository/models/identity/load", headers=auth).status_code == 200


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"{s.path}:{s.line}" for s in SNIPPETS])
def test_doc_snippet_runs(snippet: Snippet, running: Running, tmp_path: Path) -> None:
    reason = snippet.matches(SKIP)
    if reason is not None:
        pytest.skip(reason)
    env = running.env
    if snippet.matches(dict.fromkeys(WITH_TOKEN, "")) is not None:
        env = {**env, "ACTORSERVE_TOKEN": running.token}
    run_snippet(snippet, running, tmp_path, env)


#: the blocks that read the token file
TOKEN_READERS = [s for s in SNIPPETS if "XDG_RUNTIME_DIR" in s.code and s.matches(SKIP) is None]


@pytest.mark.parametrize("snippet", TOKEN_READERS, ids=[f"{s.path}:{s.line}" for s in TOKEN_READERS])
def test_token_snippets_run_without_xdg_runtime_dir(
    snippet: Snippet, running: Running, tmp_path: Path
) -> None:
    """Most containers have no XDG_RUNTIME_DIR: a block that reads the token must find it
    where the server then writes it (a KeyError or ``cat /actorserve/...`` fails here)."""
    run_snippet(snippet, running, tmp_path, running.env_without_runtime_dir)


def test_the_token_readers_are_found() -> None:
    assert {s.path for s in TOKEN_READERS} >= {"README.md", "docs/security.md"}


def run_snippet(snippet: Snippet, running: Running, tmp_path: Path, env: dict[str, str]) -> None:
    if snippet.language == "bash":
        if re.search(r"\bcurl\b", snippet.code):
            require_program("curl", "the docs' snippets call the server with it")
        commands = bash_commands(localized(snippet.code, running))
        script = "".join(f"{command}\necho '{MARK}'\n" for command, _ in commands)
        script += "for job in $(jobs -p); do wait $job; done\n"  # a stream left running ends well too
        args = ["bash", "-e", "-o", "pipefail", "-c", script]
    else:
        code = snippet.code
        earlier = snippet.matches(CONTINUES)
        if earlier is not None:
            code = (
                next(s.code for s in SNIPPETS if s.path == snippet.path and s.key[1].startswith(earlier))
                + "\n"
                + code
            )
        (tmp_path / "snippet.py").write_text(localized(code, running))
        args = [sys.executable, str(tmp_path / "snippet.py")]
    try:
        result = subprocess.run(
            args, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT, cwd=tmp_path, env=env
        )
    finally:
        reload_identity(running)
    assert result.returncode == 0, f"{snippet.path}:{snippet.line}:\n{result.stdout}\n{result.stderr}"
    if snippet.language == "bash":
        printed = result.stdout.split(MARK + "\n")
        for (command, shown), output in zip(commands, printed, strict=False):
            check_output(snippet, command, shown, output)
    forbidden = snippet.matches(NOT_PRINTED)
    if forbidden is not None:
        assert re.search(forbidden, result.stdout) is None, result.stdout


def test_every_skip_names_a_block() -> None:
    """A skip whose block was edited away must go too."""
    keys = {(s.path, s.key[1]) for s in SNIPPETS}
    for path, prefix in [*SKIP, *CONTINUES, *NOT_PRINTED, *WITH_TOKEN]:
        assert any(p == path and first.startswith(prefix) for p, first in keys), (path, prefix)


def test_the_docs_count_and_name_every_built_in_model() -> None:
    """The README, cli.md and getting-started.md's table list exactly the built-in models."""
    from actorserve.models import builtin_settings

    names = sorted(m.name for m in builtin_settings())
    count = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"][len(names)]
    for doc in ("README.md", "docs/cli.md"):
        text = " ".join((ROOT / doc).read_text().split())
        listed = re.search(rf"the {count} built-in models \(([^)]*)\)", text)
        assert listed is not None, f"{doc} does not say 'the {count} built-in models (...)'"
        assert sorted(re.findall(r"`(\w+)`", listed[1])) == names, doc
    table = (ROOT / "docs" / "getting-started.md").read_text().split("built-in models:")[1].split("\n\n")[1]
    assert sorted(re.findall(r"^\| `(\w+)` \|", table, re.M)) == names


def doc_texts() -> dict[str, str]:
    return {str(doc.relative_to(ROOT)): doc.read_text() for doc in DOCS}


def test_no_doc_installs_actorserve_from_pypi() -> None:
    """actorserve is not on PyPI: an install names the clone (``-e '.[extra]'``)."""
    for path, text in doc_texts().items():
        found = re.findall(r"pip install\s+['\"]?actorserve\b[^`\n]*", text)
        assert found == [], (path, found)


def test_every_json_body_to_predictions_says_its_content_type() -> None:
    """TorchServe's /predictions reads a body by its Content-Type, and ``curl -d`` alone
    says it is a form: a JSON body's parameters would be dropped (an unknown key, 200)."""
    for path, text in doc_texts().items():
        joined = text.replace("\\\n", " ")
        for line in joined.splitlines():
            if re.search(r"curl .*/predictions/.* -d '\{", line):
                assert "-H 'Content-Type: application/json'" in line, (path, line)


def test_every_block_that_loads_a_model_runs() -> None:
    """A load of a model the docs' server has not (``textlm``) cannot hide in SKIP."""
    loading = [s for s in SNIPPETS if "load_model(" in s.code or "/load" in s.code]
    assert loading
    for snippet in loading:
        assert snippet.matches(SKIP) is None, (snippet.path, snippet.line)


def test_getting_started_says_how_raw_mode_opens_a_sequence() -> None:
    """The raw editor serves ``accumulator`` only through a sequence: the page opens and
    ends it (tests/e2e/test_playground_raw_browser.py drives it)."""
    text = " ".join((ROOT / "docs" / "getting-started.md").read_text().split())
    raw = text.split("**raw OIP request** mode", 1)[1].split("The page is four static files", 1)[0]
    for words in ("`sequence_start: true`", "`sequence-id` header", "**End sequence**", "`accumulator`"):
        assert words in raw, words
