"""Paths the binding's tests use: the repository, the shared models and data beside it (../shared,
or NIBBLE_SHARED_DIR), the build directory and the built CLI (NIBBLE_BUILD_DIR, NIBBLE_BINARY, set
by CTest; else build/release and build/release/nibble)."""

import os
import pathlib
import subprocess

import pytest

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]
SHARED_DIR = pathlib.Path(os.environ.get("NIBBLE_SHARED_DIR") or SOURCE_DIR.parent / "shared")
# The CMake build directory the package was built in (NIBBLE_BUILD_DIR, set by CTest).
BUILD_DIR = pathlib.Path(os.environ.get("NIBBLE_BUILD_DIR") or SOURCE_DIR / "build" / "release")


def _model_dir():
    shared = SHARED_DIR / "models" / "prose-llama-7m"
    return shared if (shared / "config.json").exists() else SOURCE_DIR / "models" / "prose-llama-7m"


MODEL_DIR = _model_dir()


@pytest.fixture(scope="session")
def model_dir():
    return str(MODEL_DIR)


@pytest.fixture(scope="session")
def model():
    import nibble

    # One compute thread: the tests run beside other jobs, where a second OpenMP thread waiting for
    # a busy core makes small models many times slower (results do not depend on the count).
    return nibble.Model(str(MODEL_DIR), threads=1)


def shared_data(name):
    path = SHARED_DIR / "data" / name
    if not path.exists():
        pytest.skip(f"needs ../shared/data/{name} (not found at {path})")
    return path


@pytest.fixture(scope="session")
def prose_text():
    # The first 40 KB of prose-val: enough for several windows, quick to tokenize.
    return shared_data("prose-val.txt").read_text(encoding="utf-8")[:40000]


@pytest.fixture(scope="session")
def nibble_cli():
    path = os.environ.get("NIBBLE_BINARY") or str(SOURCE_DIR / "build" / "release" / "nibble")
    if not os.path.exists(path):
        pytest.skip(f"needs the nibble CLI (NIBBLE_BINARY, or {path})")

    def run(*args, check=True, env=None):
        proc = subprocess.run([path, *map(str, args)], capture_output=True, text=True, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"nibble {' '.join(map(str, args))} exited {proc.returncode}: {proc.stderr}")
        return proc

    return run
