"""A bad option or argument on the command line fails in one line naming the command and
the option, exit code 2, no traceback; the help and a typer.Exit keep their exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "infra", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("args,said", [
    (("simulate", "t.csv", "--deadline", "5000"), "chunkserve simulate: Invalid value for '--deadline'"),
    (("simulate", "--bogus"), "chunkserve simulate: No such option: --bogus"),
    (("trace", "gen", "--level", "99"), "chunkserve trace gen: Invalid value for '--level'"),
    (("nosuchcommand",), "chunkserve: No such command 'nosuchcommand'"),
    (("place",), "chunkserve place: Missing argument"),
    (("up", "--log-format", "xml"), "chunkserve up: Invalid value for '--log-format' (env var: 'CHUNKSERVE_LOG_FORMAT')"),
    # before any setting is read (it printed to stdout after a warning, or asked for Redis first)
    (("processor", "bogus"), "chunkserve processor: Invalid value for 'name': unknown processor 'bogus'"),
])
def test_a_bad_option_is_one_line(args, said):
    rc, out, err = _run(*args)
    assert rc == 2 and "Traceback" not in out + err
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert line.startswith("usage error: ") and said in line and "--help" in line


def test_a_bad_log_format_from_the_environment_reads_as_a_setting():
    """From the environment it is a setting, named as every other one is (it read as a usage
    error of the option, which an outside run took for a different kind of failure)."""
    rc, out, err = _run("processor", "metrics", env={"CHUNKSERVE_LOG_FORMAT": "xml"})
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and line == "configuration error: env CHUNKSERVE_LOG_FORMAT: log_format: 'xml': choose from text, json"


def test_help_and_no_arguments_keep_their_exit_codes():
    rc, out, _ = _run("--help")
    assert rc == 0 and "Usage" in out
    rc, out, err = _run()  # no command: the help, and click's exit code for it
    assert rc == 2 and "Usage" in out + err and "usage error" not in err


def test_a_worker_capacity_over_the_bound_names_the_flag():
    """It said `config: worker.capacity`, a key no file has, and only once a broker answered."""
    rc, out, err = _run("worker", "--worker-id", "w", "--capacity", "100")
    assert rc == 2 and "Traceback" not in out + err
    assert "command line: --capacity: 100 sessions: must be from 1 to max_sessions_per_worker" in out + err
