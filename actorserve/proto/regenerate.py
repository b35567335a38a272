"""Regenerate the betterproto2 code in :mod:`actorserve.proto.inference` (from
``grpc_service.proto``), :mod:`actorserve.proto.actorserve.v1` (from ``management.proto``),
and :mod:`actorserve.proto.torchserve` from TorchServe's ``inference.proto`` /
``management.proto`` (with the ``google.rpc.Status`` they use).

Usage (from a dev install, ``pip install -e '.[test]'``)::

    python -m actorserve.proto.regenerate           # rewrite the generated files
    python -m actorserve.proto.regenerate --check   # exit 1 if they are out of date

It also writes :mod:`actorserve.proto.upb_descriptor`: ``grpc_service.proto`` as a
serialized ``FileDescriptorProto``, from which :mod:`actorserve.proto.upb` builds the
upb-backed ``protobuf`` classes of the hot inference messages (in a private descriptor
pool: tritonclient registers the same ``inference.*`` names in the default one).

The generated code is committed, so the runtime needs only ``betterproto2[grpclib]`` and
``protobuf``.
Generating needs ``grpcio-tools`` (for ``protoc``), ``betterproto2-compiler`` (the
``protoc-gen-python_betterproto2`` plugin) and ``ruff`` (the plugin formats its output
with it). Their versions show up in the output (the compiler's version is even written
into it), so ``--check`` is only meaningful with the versions the project pins.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROTO_DIR = Path(__file__).resolve().parent
PROTO_FILES = ("grpc_service.proto", "management.proto")
#: TorchServe's protos, generated into their own tree (their own message pool) under
#: ``torchserve/``: (proto root relative to PROTO_DIR, proto files, files we keep).
TORCHSERVE = (
    "torchserve",
    ("inference.proto", "management.proto", "google/rpc/status.proto", "google/rpc/error_details.proto"),
    (
        "google/__init__.py",
        "google/protobuf/__init__.py",
        "google/rpc/__init__.py",
        "org/__init__.py",
        "org/pytorch/__init__.py",
        "org/pytorch/serve/__init__.py",
        "org/pytorch/serve/grpc/__init__.py",
        "org/pytorch/serve/grpc/inference/__init__.py",
        "org/pytorch/serve/grpc/management/__init__.py",
        "message_pool.py",
    ),
)
#: protoc plugin options: grpclib async client stub + grpclib async server base.
PLUGIN_OPTIONS = "client_generation=async,server_generation=async"
#: Files the plugin writes that we keep, relative to PROTO_DIR. (It also writes an empty
#: ``__init__.py`` and ``py.typed`` at the output root; ours are maintained by hand.)
GENERATED_FILES = ("inference/__init__.py", "actorserve/v1/__init__.py", "message_pool.py")
#: (``actorserve/__init__.py`` is the empty parent package of ``actorserve.v1``: ours by hand.)
_IGNORED_OUTPUTS = frozenset({"__init__.py", "py.typed", "actorserve/__init__.py"})
_PLUGIN = "protoc-gen-python_betterproto2"
_INSTALL_HINT = (
    "install the dev tools with: pip install -e '.[test]' "
    "(or: pip install 'grpcio-tools>=1.66,<1.82' 'betterproto2-compiler>=0.10,<0.11' ruff)"
)


class ToolingMissing(RuntimeError):
    """A code-generation tool is not installed."""


def _tool_versions() -> str:
    parts = []
    for dist in ("grpcio-tools", "betterproto2-compiler", "betterproto2", "ruff"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    return ", ".join(parts)


def _tool_path() -> str:
    """A PATH on which the plugin and ruff of this interpreter come first."""
    bin_dirs = [str(Path(sys.executable).parent)]
    scripts = Path(sys.prefix) / ("Scripts" if os.name == "nt" else "bin")
    if str(scripts) not in bin_dirs:
        bin_dirs.append(str(scripts))
    return os.pathsep.join([*bin_dirs, os.environ.get("PATH", "")])


def _check_tooling(path: str) -> str:
    """Return the plugin's path, or raise :class:`ToolingMissing` saying what to install."""
    missing = []
    if importlib.util.find_spec("grpc_tools") is None:
        missing.append("grpcio-tools (provides protoc as grpc_tools.protoc)")
    if importlib.util.find_spec("betterproto2_compiler") is None:
        missing.append("betterproto2-compiler (provides the protoc plugin)")
    plugin = shutil.which(_PLUGIN, path=path)
    if plugin is None and not missing:
        missing.append(f"the {_PLUGIN} script (reinstall betterproto2-compiler)")
    if shutil.which("ruff", path=path) is None:
        missing.append("ruff (betterproto2-compiler formats its output with it)")
    if missing:
        raise ToolingMissing(
            "cannot generate the protobuf code, missing: " + "; ".join(missing) + ". " + _INSTALL_HINT
        )
    assert plugin is not None
    return plugin


def generate(out_dir: Path) -> dict[str, str]:
    """Generate every tree (ours, TorchServe's) into ``out_dir``; return ``{path relative
    to PROTO_DIR: text}`` of what we keep."""
    files = _generate(out_dir, PROTO_DIR, PROTO_FILES, GENERATED_FILES)
    root, protos, kept = TORCHSERVE
    for rel, text in _generate(out_dir / root, PROTO_DIR / root, protos, kept).items():
        files[f"{root}/{rel}"] = text
    files[UPB_DESCRIPTOR] = _upb_descriptor(out_dir)
    files[SERVED_DESCRIPTORS] = _served_descriptors(out_dir)
    return files


#: The serialized descriptor of grpc_service.proto (for actorserve/proto/upb.py).
UPB_DESCRIPTOR = "upb_descriptor.py"


def _upb_descriptor(out_dir: Path) -> str:
    """``grpc_service.proto`` compiled by protoc into a ``FileDescriptorSet``, its one file
    written out as a Python bytes literal (no source info: only the messages matter)."""
    path = _tool_path()
    _check_tooling(path)
    target = out_dir / "grpc_service.descriptor"
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--descriptor_set_out={target}",
        str(PROTO_DIR / "grpc_service.proto"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"protoc failed (exit {proc.returncode}) with {_tool_versions()}:\n{proc.stderr}")
    from google.protobuf import descriptor_pb2

    (file,) = descriptor_pb2.FileDescriptorSet.FromString(target.read_bytes()).file
    data = file.SerializeToString(deterministic=True)
    lines = [repr(data[i : i + 64]) for i in range(0, len(data), 64)]
    body = "\n".join(f"    {line}" for line in lines)
    return (
        '"""grpc_service.proto as a serialized FileDescriptorProto (generated by\n'
        'python -m actorserve.proto.regenerate; do not edit)."""\n\n'
        f"SERIALIZED = (\n{body}\n)\n"
    )


#: Every served .proto with its imports, for gRPC server reflection (transport/grpcprobes).
SERVED_DESCRIPTORS = "served_descriptors.py"
#: TorchServe's files are renamed under this folder: its ``management.proto`` and ours
#: would otherwise share one name in one descriptor pool (nothing imports either).
TORCHSERVE_PREFIX = "torchserve/"


def _descriptor_set(out_dir: Path, proto_dir: Path, files: tuple[str, ...], name: str) -> list[Any]:
    """``files`` (under ``proto_dir``) and everything they import (the well-known types
    from grpcio-tools' own copy), compiled by protoc into ``FileDescriptorProto``
    records, imports first."""
    path = _tool_path()
    _check_tooling(path)
    target = out_dir / name
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={proto_dir}",
        "--include_imports",
        f"--descriptor_set_out={target}",
        *(str(proto_dir / file) for file in files),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"protoc failed (exit {proc.returncode}) with {_tool_versions()}:\n{proc.stderr}")
    from google.protobuf import descriptor_pb2

    return list(descriptor_pb2.FileDescriptorSet.FromString(target.read_bytes()).file)


def _served_descriptors(out_dir: Path) -> str:
    """Every ``.proto`` the main gRPC port serves, and their imports, as serialized
    ``FileDescriptorProto`` records (imports first, each file once; no source info)."""
    from google.protobuf import descriptor_pb2

    ours = _descriptor_set(out_dir, PROTO_DIR, PROTO_FILES, "served.descriptor")
    root, protos, _ = TORCHSERVE
    theirs = _descriptor_set(out_dir, PROTO_DIR / root, protos[:2], "torchserve.descriptor")
    for file in theirs:
        if file.name in protos[:2]:
            file.name = TORCHSERVE_PREFIX + file.name
    records: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for file in [*ours, *theirs]:
        records.setdefault(file.name, file)
    lines = []
    for name, file in records.items():
        data = file.SerializeToString(deterministic=True)
        chunks = "\n".join(f"        {data[i : i + 64]!r}" for i in range(0, len(data), 64))
        lines.append(f"    # {name}\n    (\n{chunks}\n    ),")
    body = "\n".join(lines)
    return (
        '"""The .proto files the main gRPC port serves, with their imports, as serialized\n'
        "FileDescriptorProto records, imports first (for server reflection; generated by\n"
        'python -m actorserve.proto.regenerate; do not edit)."""\n\n'
        f"FILES = (\n{body}\n)\n"
    )


def _generate(
    out_dir: Path, proto_dir: Path, proto_files: tuple[str, ...], kept: tuple[str, ...]
) -> dict[str, str]:
    """Run protoc + betterproto2 into ``out_dir``; return ``{relative path: text}`` of what we keep.

    Runs in a scratch working directory with an empty ``XDG_CONFIG_HOME`` so the ruff the
    plugin calls sees no project or user configuration: the output depends only on the
    tool versions.
    """
    path = _tool_path()
    plugin = _check_tooling(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="actorserve-protoc-") as scratch:
        env = {**os.environ, "PATH": path, "XDG_CONFIG_HOME": scratch}
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={proto_dir}",
            f"--plugin={_PLUGIN}={plugin}",
            f"--python_betterproto2_out={out_dir}",
            f"--python_betterproto2_opt={PLUGIN_OPTIONS}",
            *(str(proto_dir / name) for name in proto_files),
        ]
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"protoc failed (exit {proc.returncode}) with {_tool_versions()}:\n{proc.stdout}{proc.stderr}"
        )
    produced = {
        p.relative_to(out_dir).as_posix()
        for p in out_dir.rglob("*")
        if p.is_file() and p.relative_to(out_dir).as_posix() not in _IGNORED_OUTPUTS
    }
    unexpected = produced - set(kept)
    if unexpected:
        raise RuntimeError(
            f"protoc produced files this script does not know: {sorted(unexpected)}; "
            "update GENERATED_FILES / TORCHSERVE in actorserve/proto/regenerate.py"
        )
    return {rel: (out_dir / rel).read_text(encoding="utf-8") for rel in kept}


def regenerate(target: Path = PROTO_DIR) -> list[str]:
    """Regenerate the committed files under ``target``; return the paths that changed."""
    with tempfile.TemporaryDirectory(prefix="actorserve-proto-") as tmp:
        fresh = generate(Path(tmp))
    changed = []
    for rel, text in fresh.items():
        dest = target / rel
        if dest.exists() and dest.read_text(encoding="utf-8") == text:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
        changed.append(rel)
    return changed


def check(target: Path = PROTO_DIR, *, max_diff_lines: int = 40) -> list[str]:
    """Compare freshly generated code with the files under ``target``.

    Returns one human-readable problem per out-of-date file (empty: all up to date).
    """
    with tempfile.TemporaryDirectory(prefix="actorserve-proto-") as tmp:
        fresh = generate(Path(tmp))
    problems = []
    for rel, text in fresh.items():
        dest = target / rel
        if not dest.exists():
            problems.append(f"{rel}: missing (run python -m actorserve.proto.regenerate)")
            continue
        current = dest.read_text(encoding="utf-8")
        if current == text:
            continue
        diff = list(
            difflib.unified_diff(
                current.splitlines(),
                text.splitlines(),
                fromfile=f"committed/{rel}",
                tofile=f"generated/{rel}",
                lineterm="",
            )
        )
        added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
        removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
        shown = "\n".join(diff[:max_diff_lines])
        more = f"\n... ({len(diff) - max_diff_lines} more diff lines)" if len(diff) > max_diff_lines else ""
        problems.append(f"{rel}: out of date (+{added} -{removed} lines)\n{shown}{more}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m actorserve.proto.regenerate",
        description="Regenerate actorserve/proto/inference and actorserve/proto/actorserve/v1 from their .proto files with betterproto2.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temporary directory and exit 1 if the committed code differs",
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check()
            if problems:
                print("generated protobuf code is out of date:\n", file=sys.stderr)
                for problem in problems:
                    print(problem + "\n", file=sys.stderr)
                print(
                    f"tools: {_tool_versions()}\nfix: python -m actorserve.proto.regenerate",
                    file=sys.stderr,
                )
                return 1
            print(f"generated protobuf code is up to date ({', '.join(GENERATED_FILES)}, torchserve/...)")
            return 0
        changed = regenerate()
    except ToolingMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if changed:
        print(f"regenerated: {', '.join(changed)}")
    else:
        print("generated protobuf code already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
