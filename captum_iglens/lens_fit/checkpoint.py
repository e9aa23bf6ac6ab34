r"""
A fit written as a lens folder in the tuned-lens layout
(:class:`~captum_iglens.readout.translators.Translators`: ``params.pt`` and
``config.json``), with the fit's report beside it. The whole folder is built
under a temporary name next to its place and renamed into it when complete, so
a reader never sees half a lens.
"""

import os
import secrets
import shutil
from pathlib import Path
from typing import Callable, Dict

from captum_iglens.readout.translators import Translators


def save_lens_folder(
    folder: Path,
    translators: Translators,
    extra: Dict[str, Callable[[Path], None]],
) -> None:
    r"""
    Writes ``translators`` and further files into ``folder``, atomically: into
    a temporary sibling folder first, which then replaces ``folder``.

    Args:

        folder (Path): The lens folder; its parent must exist.
        translators (Translators): The fitted translators.
        extra (dict[str, Callable[[Path], None]]): File name to a writer of it
                    (the report and its figure).
    """
    folder = Path(folder)
    staging = folder.parent / f".{folder.name}.partial-{secrets.token_hex(6)}"
    staging.mkdir()
    try:
        translators.save(staging)
        for name, write in extra.items():
            write(staging / name)
        if folder.exists():
            old = folder.parent / f".{folder.name}.old-{secrets.token_hex(6)}"
            os.replace(folder, old)
            os.replace(staging, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
