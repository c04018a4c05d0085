"""Files a command writes when its work is done (``--json``, ``--plot``): each path is
checked before the work starts and written after it; one that cannot be written is a
``ConfigError`` naming the option and the path (one line, exit code 2), never a traceback
after a long run."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import typer

from schemas.errors import ConfigError, InfraError

__all__ = ["folder_problem", "writable", "write_output", "json_option", "folder_option", "hold_folder", "lock_holder"]


def folder_problem(folder: Path, make: bool = True) -> str | None:
    """Why no folder can be at ``folder``, or None. ``make``: it is made now, with its
    parents, when missing; else it is only checked that it is there or could be made (the
    nearest part of its path that is there is a folder this process can write in), and
    whoever writes in it makes it."""
    if make:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            return f"{folder} is a file, not a folder"
        except OSError as exc:
            return f"cannot make the folder {folder} ({exc.strerror or exc})"
    at = folder
    try:
        while not at.exists() and at.parent != at:
            at = at.parent
    except OSError as exc:
        return f"cannot make the folder {folder} ({exc.strerror or exc})"
    if not at.is_dir():
        return f"{folder} is a file, not a folder" if at == folder else \
            f"cannot make the folder {folder} ({at} is a file)"
    if not os.access(at, os.W_OK | os.X_OK):
        return f"cannot write in the folder {folder}" if at == folder else \
            f"cannot make the folder {folder} (cannot write in {at})"
    return None


def hold_folder(lock: Path, who: str) -> int:
    """Lock ``lock`` (a file in the folder a long-running command serves from) for as long
    as this process holds the descriptor returned, writing its pid there; a folder another
    process holds is an ``InfraError`` naming ``who`` and its pid (a second server on one
    folder corrupts it). The lock goes with the process, even when it is killed."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise InfraError(f"{lock.parent} is in use by {who} (pid {holder}): stop that one first, "
                         "or give another data folder") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def lock_holder(lock: Path) -> str | None:
    """The pid a process wrote in ``lock`` while it holds it (:func:`hold_folder`), else None."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return os.read(fd, 32).decode(errors="replace").strip() or "?"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def writable(reads: Sequence[Path] = (), **paths: Path | None) -> None:
    """Each output (``option=path``) a file this process can write: not a folder, not one of
    the files it ``reads`` (a results file written over the trace or snapshot it came from),
    in a folder that is there or can be made (it is made now, with its parents), and one it
    may create or append to (tried, and a file made for the try removed); else a
    ``ConfigError`` naming ``--option``."""
    for option, path in paths.items():
        if path is None:
            continue
        if path.is_dir():
            raise ConfigError(f"--{option}", "is a folder; give a file name", str(path))
        read = next((r for r in reads if _same_file(r, path)), None)
        if read is not None:
            raise ConfigError(f"--{option}", f"is the input {read} itself: writing it would replace what it "
                              "reads; give another file name", str(path))
        problem = folder_problem(path.parent)
        if problem:
            raise ConfigError(f"--{option}", f"cannot make its folder: {problem}", str(path))
        try:  # a folder this process may write in can still refuse the file (/proc, a read-only mount)
            there = path.exists()
            with open(path, "a"):
                pass
            if not there:
                path.unlink()
        except OSError as exc:
            raise ConfigError(f"--{option}", f"cannot write ({exc.strerror or exc})", str(path)) from None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is not there (yet): the same path, written otherwise
        return a.resolve() == b.resolve()


def write_output(option: str, path: Path, text: str) -> None:
    """Write ``text`` to the output ``--option`` names; a failure is a ``ConfigError``."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise ConfigError(f"--{option}", f"cannot write ({exc.strerror or exc})", str(path)) from None


def _check_json(value: Optional[Path]) -> Optional[Path]:
    writable(json=value)
    return value


def json_option(help: str) -> Any:
    """A ``--json PATH`` option whose path is checked as the command line is read, before the
    command's work starts."""
    return typer.Option(None, "--json", help=help, callback=_check_json)


def folder_option(option: str, help: str) -> Any:
    """A ``--option FOLDER`` option (logs, reports) whose folder is checked, and refused in
    one line naming the option, as the command line is read: before any broker starts, not as
    a traceback after the run. It is made by whatever writes there first, so a command refused
    later (a second `up` on the same topics) leaves none behind."""
    def check(value: Optional[Path]) -> Optional[Path]:
        problem = folder_problem(value, make=False) if value is not None else None
        if problem:
            raise ConfigError(f"--{option}", problem, str(value))
        return value

    return typer.Option(None, f"--{option}", help=help, callback=check)
