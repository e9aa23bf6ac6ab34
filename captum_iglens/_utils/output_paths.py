r"""
The one check of every output path, file or folder, made before any work and
without importing torch (so that the command line refuses a bad path at once):
not empty, in an existing folder that can be written, not a folder where a file
is expected (nor a file where a folder is), not a device, FIFO or socket, not one
of the run's inputs, and with the suffix its format needs. A symbolic link is
followed: the file it points to is what gets written.
"""

import os
import secrets
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

PathLike = Union[str, Path]


def check_writable(path: PathLike, what: str, suffix: Optional[str] = None) -> Path:
    r"""
    The path of an output file, checked before any work.

    Args:

        path (str or Path): The file to be written.
        what (str): The argument's name, for the error, e.g. ``"--json"``.
        suffix (str, optional): The one suffix the file's format allows (e.g.
                    ``".png"``), compared case-insensitively; a path with no
                    suffix is taken too. None takes any suffix.
                    Default: None

    Returns:
        *Path*: ``path``.

    Raises:
        ValueError: Naming ``what``: if ``path`` is empty, a folder, a read-only
                    file, in a folder that does not exist or cannot be written,
                    or has another suffix than ``suffix``.
    """
    path = _non_empty(path, what, "a file path such as out.json")
    if path.is_dir():
        raise ValueError(f"{what}: {path} is a folder; expected a file path")
    if path.exists() and not path.is_file():
        raise ValueError(
            f"{what}: {path} exists and is not a regular file (a device, FIFO or "
            "socket); expected a file path"
        )
    if suffix is not None and path.suffix and path.suffix.lower() != suffix:
        raise ValueError(
            f"{what}: {path} ends in {path.suffix}, expected a {suffix} file; "
            f"name it e.g. {path.with_suffix(suffix).name}"
        )
    _check_folder_exists(Path(os.path.realpath(path)).parent, what)
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{what}: {path} exists and is read-only")
    return path


def check_not_input(
    path: PathLike,
    what: str,
    inputs: Mapping[str, PathLike],
    written: Sequence[str] = (),
) -> None:
    r"""
    Refuses an output that would replace one of the run's inputs: the same
    file as an input file, a file that exists inside an input folder and is not
    an earlier output (a model's config, a lens's weights; a page, a table, a
    picture or a result file is replaced), or any path inside an input folder
    the run also writes (a resumed run's records). Paths are compared as real
    paths, so a link and its target are one file; inputs that do not exist as
    paths (an embedded model's name, say) are skipped.

    Args:

        path (str or Path): The output file.
        what (str): The output's argument name, for the error, e.g. ``"--json"``.
        inputs (Mapping[str, str or Path]): The run's inputs, by argument name,
                    e.g. ``{"--task": "t.jsonl", "--model": "folder"}``.
        written (Sequence[str], optional): The names in ``inputs`` of folders
                    the run writes in too, e.g. ``("--out",)``.
                    Default: ()

    Raises:
        ValueError: Naming ``what`` and the input, if ``path`` is one of them or
                    lies inside one as above.
    """
    real = Path(os.path.realpath(path))
    for name, given in inputs.items():
        source = Path(os.path.realpath(given))
        if real == source:
            raise ValueError(
                f"{what}: {path} is the run's input {name}; writing it would replace "
                "it, so give the output another path"
            )
        if source.is_dir() and source in real.parents:
            if name in written:
                raise ValueError(
                    f"{what}: {path} is inside {name} ({given}), the folder the run "
                    "keeps its records in; give the output a path outside it"
                )
            if real.exists() and not _an_output(real):
                raise ValueError(
                    f"{what}: {path} is a file in the folder of {name} ({given}), "
                    "which the run reads, and not one this package wrote; give the "
                    "output a path outside it"
                )


#: The suffixes of outputs no model or lens loader reads.
_PAGES = (".html", ".csv", ".png")


def _an_output(path: Path) -> bool:
    """Whether ``path`` is what an earlier run wrote (a page, a table, a
    picture, or a result file, whose JSON starts with its ``kind``), so that
    replacing it loses no input."""
    if path.suffix.lower() in _PAGES:
        return True
    with open(path, "rb") as handle:
        return handle.read(8) == b'{"kind":'


def check_apart(folder: PathLike, what: str, inputs: Mapping[str, PathLike]) -> None:
    r"""
    Refuses an output folder that is one of the run's inputs, lies inside an
    input folder or holds an input (its records would be written among the
    inputs, or an input among its records). Paths are compared as real paths;
    inputs that do not exist as paths (an embedded model's name) are skipped.

    Args:

        folder (str or Path): The output folder (it need not exist yet).
        what (str): Its argument's name, for the error, e.g. ``"--out"``.
        inputs (Mapping[str, str or Path]): The run's inputs, by argument name.

    Raises:
        ValueError: Naming ``what`` and the input.
    """
    real = Path(os.path.realpath(folder))
    for name, given in inputs.items():
        if not os.path.exists(given):
            continue
        source = Path(os.path.realpath(given))
        if source == real or source in real.parents or real in source.parents:
            raise ValueError(
                f"{what}: {folder} holds or lies in the run's input {name} "
                f"({given}); give the output folder a path apart from its inputs"
            )


def check_folder(path: PathLike, what: str) -> Path:
    r"""
    The path of an output folder, checked before any work: an existing,
    writable folder, or a new one whose parent is an existing, writable folder.

    Args:

        path (str or Path): The folder to be written in (or made).
        what (str): The argument's name, for the error, e.g. ``"--out"``.

    Returns:
        *Path*: ``path``.

    Raises:
        ValueError: Naming ``what``: if ``path`` is empty or a file, or its
                    parent folder does not exist or cannot be written.
    """
    path = _non_empty(path, what, "a folder such as out")
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what}: {path} is a file; expected a folder")
    _check_folder_exists(path if path.exists() else path.parent, what)
    return path


def _non_empty(path: PathLike, what: str, example: str) -> Path:
    # Path("") is Path("."): the empty text is refused before it becomes one.
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a path (str or Path), got {path!r}")
    if not os.fspath(path).strip():
        raise ValueError(f"{what}: the path is empty or blank; expected {example}")
    return Path(path)


def _check_folder_exists(folder: Path, what: str) -> None:
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what}: {folder} is a file, not a folder")
    if not folder.is_dir():
        raise ValueError(f"{what}: the folder {folder} does not exist")
    # Tried, not asked: os.access says yes to root on /proc or a read-only share.
    probe = folder / f".captum-iglens-probe.{secrets.token_hex(8)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as error:
        raise ValueError(
            f"{what}: cannot write in the folder {folder} ({error.strerror})"
        ) from None
