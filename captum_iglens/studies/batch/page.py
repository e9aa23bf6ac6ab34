r"""
The viewer page of a batch folder.
"""

from pathlib import Path
from typing import Optional, Union

from captum_iglens._utils.output_paths import check_writable
from captum_iglens._utils.serialization import write_atomic
from captum_iglens.studies.batch.records import RESULTS, read_results, to_result
from captum_iglens.studies.batch.resume import RUN, read_run


def write_html(
    out_dir: Union[str, Path], path: Optional[Union[str, Path]] = None
) -> Path:
    r"""
    Writes the interactive viewer of a folder written by
    :func:`~captum_iglens.studies.batch.run_batch`: the mean credit per layer,
    the distribution of onsets and every prompt's map, in one self-contained
    HTML file.

    Args:

        out_dir (str or Path): The output folder (``results.jsonl``, ``run.json``).
        path (str or Path, optional): The page. Default: ``out_dir/index.html``.

    Returns:
        *Path*: the page written.
    """
    from captum_iglens.viewer._page import render_page
    from captum_iglens.viewer._payload import batch_payload

    out = Path(out_dir)
    if not (out / RESULTS).is_file():
        raise ValueError(f"out_dir: {out} holds no {RESULTS}")
    run = read_run(out) if (out / RUN).is_file() else {}
    records = read_results(out / RESULTS)
    items = [dict(record, result=to_result(record)) for record in records]
    page = Path(path) if path is not None else out / "index.html"
    check_writable(page, "path")
    write_atomic(page, render_page(batch_payload(items, run)))
    return page
